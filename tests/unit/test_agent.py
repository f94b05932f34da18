"""Agent mechanics on tiny random models (the text is gibberish: assert mechanics, never content)."""
import logging
import math

import pytest
import torch

from latentwire.agent import SLOT, Agent, Answer
from latentwire.errors import ContextOverflowError, GeometryMismatchError, StateFormatError, UnknownNameError
from latentwire.message import Rows
from latentwire.models import output_cache, tiny_model
from latentwire.state import KVState

PROMPT = "Read this: the sky is green."


@pytest.fixture
def agent(agent_for, arch):
    return agent_for(arch)


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


# -- think ----------------------------------------------------------------------------------------
def test_think_zero_steps_returns_same_state_and_logs(agent, caplog):
    state = agent.prefill(PROMPT)
    with caplog.at_level(logging.INFO, logger="latentwire"):
        out = agent.think(state, 0)
    assert out is state
    records = [r for r in caplog.records if r.name == "latentwire" and r.levelno == logging.INFO]
    assert any("steps=0" in r.getMessage() for r in records)
    assert agent.calls[-1].op == "think" and agent.calls[-1].rows_in == 0


@pytest.mark.parametrize("mode", ["rescale", "realign"])
def test_think_appends_latent_rows_at_mean_norm(agent, mode):
    state = agent.prefill(PROMPT)
    T = len(state)
    out = agent.think(state, 3, mode=mode)
    assert len(out) == T + 3 and len(state) == T  # the input state is untouched
    assert torch.equal(out.token_ids[:T], state.token_ids)
    assert torch.equal(out.token_ids[T:], torch.full((3,), -1))
    assert torch.equal(out.positions, torch.arange(T + 3)) and out.last_hidden is not None
    assert out.latents.shape == (3, agent.geometry.hidden_size)
    for norm in out.latents.norm(dim=-1).tolist():
        assert rel(norm, agent.mean_embedding_norm) <= 1e-4
    assert agent.calls[-1].op == "think" and agent.calls[-1].rows_in == 3 and agent.calls[-1].context == T + 3


def test_realign_matrix_is_least_squares_output_to_input(agent_for, tokenizer):
    """W_a minimises |W_out W_a - W_in| (LatentMAS): with tied embeddings it is ~I (Gemma: ~√d I)."""
    for arch, scale in (("llama", 1.0), ("gemma3", 8.0)):
        agent = agent_for(arch)
        assert (agent.realign_matrix - scale * torch.eye(64)).abs().max() <= 1e-3 * scale, arch
    untied = Agent(tiny_model("llama", tie_word_embeddings=False), tokenizer, model_name="llama")
    w_out = untied.model.get_output_embeddings().weight.detach().double()
    w_in = untied.model.get_input_embeddings().weight.detach().double()
    want = torch.linalg.lstsq(w_out, w_in).solution
    assert (untied.realign_matrix.double() - want).norm() <= 1e-3 * want.norm()
    state = untied.prefill(PROMPT)  # untied: the two modes really differ
    rescale, realign = untied.think(state, 1, "rescale").latents, untied.think(state, 1, "realign").latents
    assert (rescale - realign).norm() > 0.1 * rescale.norm()


def test_think_rejects_bad_arguments(agent):
    state = agent.prefill(PROMPT)
    with pytest.raises(ValueError):
        agent.think(state, -1)
    with pytest.raises(UnknownNameError) as e:
        agent.think(state, 2, mode="telepathy")
    assert "realign" in str(e.value) and "rescale" in str(e.value) and "telepathy" in str(e.value)
    with pytest.raises(StateFormatError, match="last_hidden"):
        agent.think(state.select(range(len(state) - 1)), 1)


def test_think_loop_equals_one_forward_over_embeddings(agent, kv_diff):
    """prefill + G latent steps == one forward over [prompt embeddings, latent rows] (rows at the right positions)."""
    state = agent.prefill(PROMPT)
    T, out = len(state), agent.think(state, 2)
    with torch.inference_mode():  # token_ids are inference tensors: embed them under inference mode
        embeds = torch.cat([agent.embed(state.token_ids), out.latents])[None]
        ref_out = agent.model.model(inputs_embeds=embeds, use_cache=True)
    ref = KVState.from_cache(output_cache(ref_out), agent.geometry, out.token_ids, out.latents)
    assert kv_diff(out, ref) <= 1e-4 and kv_diff(out, ref, "values") <= 1e-4
    hidden = ref_out.last_hidden_state[0]
    assert (out.last_hidden - hidden[-1]).abs().max() <= 1e-4
    # each latent row is the mapped output of the row before it
    for i in range(2):
        assert (out.latents[i] - agent.latent_vector(hidden[T - 1 + i])).abs().max() <= 1e-4


def test_think_on_shifted_state_keeps_its_positions(agent, kv_diff):
    state = agent.prefill(PROMPT)
    T = len(state)
    moved = agent.think(state.shift(5), 2)
    assert torch.equal(moved.positions, torch.arange(5, T + 7))
    assert kv_diff(moved.compact(), agent.think(state, 2)) <= 1e-4


# -- embeddings -----------------------------------------------------------------------------------
def test_embed_includes_gemma_sqrt_d(agent_for):
    ids = torch.tensor([5, 17, 200, 3])
    for arch, scale in (("gemma3", math.sqrt(64)), ("llama", 1.0), ("qwen2", 1.0)):
        agent = agent_for(arch)
        weight = agent.model.get_input_embeddings().weight.detach()
        with torch.no_grad():
            got = agent.embed(ids)
        assert (got - weight[ids] * scale).abs().max() <= 1e-5, arch
        if scale == 1.0:
            assert torch.equal(got, weight[ids])
        want_norm = float((weight * scale).norm(dim=-1).mean())
        assert rel(agent.mean_embedding_norm, want_norm) <= 1e-5, arch


# -- answer ---------------------------------------------------------------------------------------
TEXT_MESSAGE = "the sky is green"


def make_message(kind, agent):
    """None, text, Rows or a KVState; the state is another agent's prefill plus two latent steps."""
    if kind in (None, "text"):
        return None if kind is None else TEXT_MESSAGE
    sender = Agent(agent.model, agent.tokenizer, model_name=agent.model_name)
    state = sender.think(sender.prefill("Sender notes: the sky is green."), 2)
    return state if kind == "kv" else agent.rows(state)


@pytest.mark.parametrize("kind", [None, "text", "rows", "kv"])
def test_answer_accounting(agent, kind):
    message = make_message(kind, agent)
    before = len(agent.calls)
    ans = agent.answer("What colour is the sky?", message=message, max_new_tokens=5)
    assert isinstance(ans, Answer)
    assert len(ans.token_ids) <= 5
    assert ans.context == ans.message_rows + ans.prompt_tokens + len(ans.token_ids)
    # the tiny tokenizer is byte-level without merges: a text message is one token per byte
    expected_rows = len(message) if kind in ("rows", "kv") else len((message or "").encode())
    assert ans.message_rows == expected_rows
    assert ans.prompt_tokens > 0
    assert ans.text == agent.tokenizer.decode(list(ans.token_ids), skip_special_tokens=True).strip()
    assert not set(ans.token_ids) & agent.stop_ids
    assert len(agent.calls) == before + 1
    rec = agent.calls[-1]
    assert (rec.op, rec.rows_in, rec.tokens_out, rec.context) == (
        "answer", ans.message_rows + ans.prompt_tokens, len(ans.token_ids), ans.context)


def test_answer_prompt_tokens_agree_for_text_and_rows(agent):
    rows = make_message("rows", agent)
    a = agent.answer("Why?", message="x", max_new_tokens=1)
    b = agent.answer("Why?", message=rows, max_new_tokens=1)
    assert a.prompt_tokens == b.prompt_tokens


def test_answer_from_shifted_state_is_the_same(agent, spy_decode):
    state = make_message("kv", agent)
    seen = spy_decode(agent)
    a = agent.answer("What colour?", message=state, max_new_tokens=6)
    b = agent.answer("What colour?", message=state.shift(37), max_new_tokens=6)
    assert a.token_ids == b.token_ids
    (start_a, hidden_a, keys_a), (start_b, hidden_b, keys_b) = seen
    assert start_a == start_b == len(state) + a.prompt_tokens
    assert (hidden_a - hidden_b).abs().max() <= 1e-4
    assert all((x - y).abs().max() <= 1e-4 for x, y in zip(keys_a, keys_b, strict=True))


def test_answer_rejects_unknown_message_type(agent):
    with pytest.raises(TypeError):
        agent.answer("q", message=42)


# -- refusals before compute ------------------------------------------------------------------------
@pytest.fixture
def no_forward(monkeypatch):
    calls = []

    def patch(agent):
        monkeypatch.setattr(agent, "_forward", lambda *a, **k: calls.append(1) or pytest.fail("_forward called"))
        return calls

    return patch


@pytest.mark.parametrize("kind", ["kv", "rows", "text"])
def test_context_overflow_raised_before_compute(agent_for, prefill_state, random_ids, no_forward, arch, kind):
    agent = agent_for(arch, context_window=64)
    state = prefill_state(arch, random_ids(60))
    message = {"kv": state, "rows": Rows(torch.zeros(60, agent.geometry.hidden_size), torch.full((60,), -1)),
               "text": "n" * 60}[kind]
    forwards = no_forward(agent)
    with pytest.raises(ContextOverflowError) as e:
        agent.answer("Who?", message=message, max_new_tokens=16)
    assert e.value.window == 64 and e.value.needed > 64 and e.value.breakdown["max_new_tokens"] == 16
    if kind != "text":
        assert e.value.breakdown["message"] == 60
    assert agent.calls == [] and forwards == []


def test_prefill_overflow_raised_before_compute(agent_for, no_forward, arch):
    agent = agent_for(arch, context_window=16)
    forwards = no_forward(agent)
    with pytest.raises(ContextOverflowError) as e:
        agent.prefill("x" * 100)
    assert e.value.breakdown["prompt"] > 100
    assert agent.calls == [] and forwards == []


def test_think_overflow_raised_before_compute(agent_for, monkeypatch):
    agent = agent_for("llama", context_window=64)
    state = agent.prefill("y" * 30)
    assert len(state) < 64
    monkeypatch.setattr(agent, "_forward", lambda *a, **k: pytest.fail("_forward called"))
    n_calls = len(agent.calls)
    with pytest.raises(ContextOverflowError):
        agent.think(state, 64 - len(state) + 1)
    assert len(agent.calls) == n_calls


def test_answer_refuses_other_geometry(agent_for, prefill_state, random_ids, no_forward):
    agent = agent_for("gemma3")
    forwards = no_forward(agent)
    with pytest.raises(GeometryMismatchError):
        agent.answer("q", message=prefill_state("llama", random_ids(10)))
    assert agent.calls == [] and forwards == []


def test_rows_of_wrong_width_refused(agent, no_forward):
    forwards = no_forward(agent)
    width = agent.geometry.hidden_size // 2
    with pytest.raises(StateFormatError, match="width"):
        agent.answer("q", message=Rows(torch.zeros(3, width), torch.tensor([1, 2, -1])))
    assert agent.calls == [] and forwards == []


def test_rows_of_another_model_refused_before_compute(agent, no_forward):
    forwards = no_forward(agent)
    g = agent.geometry
    rows = Rows(torch.zeros(3, g.hidden_size), torch.tensor([1, 2, -1]), ("another-model", g.tokenizer))
    with pytest.raises(GeometryMismatchError, match="another-model"):
        agent.answer("q", message=rows)
    with pytest.raises(GeometryMismatchError, match="another-model"):
        agent.prefill("a " + SLOT + " b", rows=rows)
    assert agent.calls == [] and forwards == []


def test_rows_carry_their_space_and_concatenate_only_within_it(agent):
    rows = agent.rows(agent.prefill("hello"))
    assert rows.space == (agent.geometry.model, agent.geometry.tokenizer)
    both = Rows.cat([rows, rows])
    assert len(both) == 2 * len(rows) and both.space == rows.space
    stranger = Rows(rows.embeds, rows.token_ids, ("another-model", "x"))
    with pytest.raises(GeometryMismatchError):
        Rows.cat([rows, stranger])
    assert Rows.cat([rows, Rows(rows.embeds, rows.token_ids)]).space == rows.space  # unlabelled rows join


def test_rows_shape_checked():
    with pytest.raises(StateFormatError):
        Rows(torch.zeros(3, 8), torch.zeros(4, dtype=torch.int64))


def test_rows_of_token_embeddings_answer_like_the_text(agent, spy_decode):
    """Rows holding a text's own token embeddings sit exactly where the text would (same slot, same context)."""
    text = TEXT_MESSAGE
    ids = torch.tensor(agent.tokenizer(text, add_special_tokens=False)["input_ids"])
    with torch.inference_mode():
        rows = Rows(agent.embed(ids), ids)
    seen = spy_decode(agent)
    a = agent.answer("What colour?", message=text, max_new_tokens=6)
    b = agent.answer("What colour?", message=rows, max_new_tokens=6)
    assert (a.message_rows, a.prompt_tokens, a.token_ids) == (b.message_rows, b.prompt_tokens, b.token_ids)
    (start_a, hidden_a, keys_a), (start_b, hidden_b, keys_b) = seen
    assert start_a == start_b
    assert (hidden_a - hidden_b).abs().max() <= 1e-5
    assert all((x - y).abs().max() <= 1e-5 for x, y in zip(keys_a, keys_b, strict=True))


def test_typed_errors_survive_pickling():
    """Errors cross process boundaries (Ray actors): they must come back as themselves."""
    import pickle

    from latentwire.errors import ContextOverflowError, UnknownNameError

    for err in (UnknownNameError("protocol", "x", ["a", "b"]), ContextOverflowError(10, 5, {"prompt": 10})):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and str(back) == str(err)


def test_a_token_id_past_the_models_embeddings_is_a_typed_error(agent_for):
    """SmolLM2's GGUF tokenizer encodes '<FILL_ME>' as id 49156, past its 49,152 embeddings: refused when the ids
    reach the model (prefill, answer), naming the id and its token, not an IndexError inside the model; tokenising
    alone (alignment reads other tokenizers' ids) is not refused."""
    from latentwire.errors import TokenizerMismatchError

    agent = agent_for("llama")
    ids = agent.chat_ids("Read this.")
    agent._vocab_rows = max(ids)  # as if the model had one embedding too few for this text
    assert agent.chat_ids("Read this.") == ids
    for read in (lambda: agent.prefill("Read this."), lambda: agent.answer("Read this.", max_new_tokens=1)):
        with pytest.raises(TokenizerMismatchError, match=rf"gives id {max(ids)} \(.*\) but the model embeds {max(ids)}"):
            read()
    agent._vocab_rows = max(ids) + 1
    assert len(agent.prefill("Read this.")) == len(ids)


def test_stop_ids_keep_a_turn_end_that_is_also_the_unknown_token(agent_for, monkeypatch):
    """SmolLM2's <|endoftext|> is id 0, which is also its unk token: it stops a decode. A token the vocabulary lacks
    (converted to the unk id) adds nothing."""
    class Vocab:  # SmolLM2's: <|endoftext|> = 0 = unk, <|im_end|> = 2; no <end_of_turn>
        eos_token_id, unk_token_id = 2, 0
        ids = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}

        def convert_tokens_to_ids(self, tok):
            return self.ids.get(tok, self.unk_token_id)

        def convert_ids_to_tokens(self, tid):
            return {v: k for k, v in self.ids.items()}[tid]

    agent = agent_for("llama")
    agent.tokenizer = Vocab()
    monkeypatch.setattr(agent.model.generation_config, "eos_token_id", 2)  # the session's model: restored after
    assert {0, 2} <= agent.stop_ids and 1 not in agent.stop_ids


def test_latent_step_constants_do_not_keep_a_copy_of_the_embedding_table(agent_for):
    """The mean embedding norm and W_a are kept; the (V, d) scaled copy they are computed from is not (0.5-0.7 GB
    in fp32 for the bundled Qwen and Gemma)."""
    agent = agent_for("gemma3")
    V, d = agent.model.get_input_embeddings().weight.shape
    assert agent.mean_embedding_norm > 0 and agent.realign_matrix.shape == (d, d)
    kept = [k for k, v in vars(agent).items() if isinstance(v, torch.Tensor) and v.shape == (V, d)]
    assert kept == []
