"""PackLLM: perplexity weights, fused greedy decoding, and the checks around it (tiny models)."""
import copy

import pytest
import torch

from latentwire.agent import Agent
from latentwire.errors import GeometryMismatchError, UnknownNameError
from latentwire.protocols import get_protocol
from latentwire.protocols.packllm import PACK_PROMPT, PackLLM

QUESTION = "What is the cat called?"
DOCS = ["The cat is called Tom.", "Tom lives in Paris, near the river."]


@pytest.fixture
def agent(models, tokenizer):
    return Agent(models["gemma3"], tokenizer, model_name="gemma3")  # its greedy answers are non-empty


def test_validation():
    with pytest.raises(ValueError):
        PackLLM(tau=0)
    with pytest.raises(UnknownNameError, match="prompt"):
        PackLLM(scope="answer")


def test_weights_prefer_the_lower_perplexity_and_flatten_with_tau():
    w = PackLLM(tau=1.0).weights([torch.tensor([1.0, 1.0]), torch.tensor([3.0, 3.0])])
    assert torch.allclose(w, torch.softmax(torch.tensor([-1.0, -3.0], dtype=torch.float64), 0))
    assert w[0] > 0.85 and abs(float(w.sum()) - 1) < 1e-12
    flat = PackLLM(tau=1e6).weights([torch.tensor([1.0]), torch.tensor([3.0])])
    assert torch.allclose(flat, torch.full((2,), 0.5, dtype=torch.float64), atol=1e-5)


def test_stream_prompt_nll_matches_a_full_forward(agent):
    prompt = PACK_PROMPT.format(document=DOCS[0], question=QUESTION)
    s = agent.stream(prompt, chunk=5)  # several chunks
    ids = torch.tensor(agent.chat_ids(prompt))
    with torch.inference_mode():
        logits = agent.logits(agent.model.model(input_ids=ids[None]).last_hidden_state[0]).float()
    want = torch.nn.functional.cross_entropy(logits[:-1], ids[1:], reduction="none")
    assert torch.allclose(s.prompt_nll, want, atol=1e-4)
    assert torch.allclose(s.logprobs, torch.log_softmax(logits[-1], -1), atol=1e-4)


def test_one_agent_decodes_exactly_its_own_greedy_answer(agent):
    out = PackLLM(max_new_tokens=6).run([agent], DOCS[:1], agent, QUESTION)
    assert out.details["weights"] == [1.0]
    assert out.answer == agent.answer(PACK_PROMPT.format(document=DOCS[0], question=QUESTION), max_new_tokens=6).text


def test_identical_agents_get_equal_weights_and_the_same_answer(agent, models, tokenizer):
    twin = Agent(models["gemma3"], tokenizer, model_name="gemma3")
    single = PackLLM(max_new_tokens=5).run([agent], DOCS[:1], agent, QUESTION)
    pair = PackLLM(max_new_tokens=5).run([agent, twin], DOCS[:1] * 2, agent, QUESTION)
    assert pair.details["weights"] == [0.5, 0.5] and pair.answer == single.answer


def test_two_documents_fuse_with_perplexity_weights(agent, models, tokenizer):
    other = Agent(models["gemma3"], tokenizer, model_name="gemma3")
    out = get_protocol("packllm", max_new_tokens=3, scope="question").run([agent, other], DOCS, agent, QUESTION)
    w = out.details["weights"]
    assert len(w) == 2 and abs(sum(w) - 1) < 1e-5 and w[0] != w[1]
    assert len(out.sender_seconds) == 2 and out.message_bytes == 0


def test_question_scope_scores_the_question_tokens_only(agent):
    from latentwire.protocols.packllm import _question_nll

    prompt = PACK_PROMPT.format(document=DOCS[0], question=QUESTION)
    s = agent.stream(prompt)
    q = _question_nll(agent, s, prompt, QUESTION)
    assert len(q) == len(agent.tokenizer(QUESTION, add_special_tokens=False)["input_ids"])  # byte-level tokenizer
    text = agent.chat_text(prompt)
    start = len(agent.tokenizer(text[:text.rfind(QUESTION)], add_special_tokens=False)["input_ids"])
    assert torch.equal(q, s.prompt_nll[start - 1:start - 1 + len(q)])


def test_agents_with_another_vocabulary_are_refused(agent, models, tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.get_vocab = lambda: {"a": 0}
    stranger = Agent(models["gemma3"], tok, model_name="other")
    with pytest.raises(GeometryMismatchError, match="tokenizer"):
        PackLLM().run([agent, stranger], DOCS, agent, QUESTION)


def test_a_templateless_model_stops_fused_decoding_at_its_next_turn(models, tokenizer, monkeypatch):
    """As Agent's decode: the fused token completing "User:" stops PackLLM's decode, and the text drops the marker's
    start; with a chat template the same tokens run on."""
    script_text = "Lisbon\n\nUser: And where"
    ids = tokenizer(script_text, add_special_tokens=False)["input_ids"]

    def run(template: bool) -> str:
        agent = Agent(models["llama"], tokenizer, "llama")
        if not template:
            monkeypatch.setattr(agent.tokenizer, "chat_template", None)  # the session's tokenizer: restored after
        real, step = agent.logits, []

        def scripted(hidden):  # prompt rows score as the model does; each decode step gives the next scripted id
            if hidden.dim() == 2:
                return real(hidden)
            step.append(1)
            return torch.nn.functional.one_hot(torch.tensor(ids[len(step) - 1]), real(hidden).shape[-1]).float() * 50

        monkeypatch.setattr(agent, "logits", scripted)
        out = PackLLM(max_new_tokens=len(ids)).run([agent], ["Ana leads Orion in Lisbon."], agent, "Where?")
        monkeypatch.undo()
        return out.answer

    assert run(template=True) == script_text
    assert run(template=False) == "Lisbon"
