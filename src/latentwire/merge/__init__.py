"""Order-free merging: content-addressed fragments, the FragmentSet CvRDT, and its renders (docs/methods.md#merging)."""
from .bag_merge import BagMerge  # importing a render registers it
from .base import RENDERS, Render, get_render
from .canonical_merge import CanonicalMerge
from .fragments import Fragment, FragmentSet

__all__ = ["RENDERS", "BagMerge", "CanonicalMerge", "Fragment", "FragmentSet", "Render", "get_render"]
