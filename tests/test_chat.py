"""farctx chat on the tiny model: piped stdin, a conversation past n_ctx_train, a loaded document."""

from __future__ import annotations

import io

from test_errors import run_cli

from farctx.chat import Chat, fixed_head_tokens, run_chat
from farctx.slot import Slot


def test_chat_cli_reads_lines_until_exit(tiny_model, tmp_path):
    document = tmp_path / "doc.txt"
    document.write_text("The key is 4711. " * 20)
    result = run_cli("chat", "-m", str(tiny_model), "--method", "lminf", "-n", "4", "--temp", "0",
                     "-sys", "You are terse.", "-f", str(document),
                     stdin="What is the key?\nAnd again?\n/exit\nnever read\n")
    assert result.returncode == 0, result.stderr
    answers = result.stdout.splitlines()
    assert len(answers) == 2 and all(answers)
    head = fixed_head_tokens(str(tiny_model), "You are terse.")
    assert f"n_global {head}," in result.stderr  # the system prompt is the global tokens


def test_fixed_head_is_what_every_prompt_starts_with(tiny_model):
    with_system = fixed_head_tokens(str(tiny_model), "You are a very helpful assistant who answers briefly.")
    short_system = fixed_head_tokens(str(tiny_model), "Hi.")
    assert with_system > short_system > 0


def test_lminf_conversation_runs_past_n_ctx_train_in_constant_memory(tiny_model):
    head = fixed_head_tokens(str(tiny_model), "Answer.")
    slot = Slot(str(tiny_model), {"n_ubatch": 16}, {"method": "lminf", "n_global": head}, log=io.StringIO())
    chat = Chat(slot, system="Answer.", sampling={"max_tokens": 4, "temperature": 0})
    cache = slot.engine(slot.method).n_ctx()
    for i in range(4):
        chat.turn(f"Tell me about item {i} " + "and more " * 8, io.StringIO())
        assert slot.llm is not None and slot.llm.n_ctx() == cache
        assert slot.llm.stats()["n_cells_used"] <= cache
    stats = slot.llm.stats()
    assert stats["n_past"] > 4 * 32  # the conversation is several times the trained context
    assert len(chat.messages) == 1 + 2 * 4 and chat.messages[-1]["role"] == "assistant"


def test_document_goes_before_the_first_message(tiny_model):
    slot = Slot(str(tiny_model), {"n_ubatch": 16}, {"method": "lminf"}, log=io.StringIO())
    chat = Chat(slot, document="A long document.", sampling={"max_tokens": 2, "temperature": 0})
    chat.turn("Summarise it.", io.StringIO())
    chat.turn("Thanks.", io.StringIO())
    assert chat.messages[0] == {"role": "user", "content": "A long document.\n\nSummarise it."}
    assert chat.messages[2] == {"role": "user", "content": "Thanks."}


def test_vanilla_says_when_the_conversation_does_not_fit_and_goes_on(tiny_model):
    slot = Slot(str(tiny_model), {"n_ubatch": 16}, {"method": "vanilla"}, log=io.StringIO())
    chat = Chat(slot, sampling={"max_tokens": 2, "temperature": 0})
    out, err = io.StringIO(), io.StringIO()
    run_chat(chat, io.StringIO("word " * 400 + "\nshort\n"), out, err)
    assert "exceeds the available context size" in err.getvalue() and "cache 256 cells" in err.getvalue()
    assert [m["content"] for m in chat.messages if m["role"] == "user"] == ["short"]
    assert len(out.getvalue().splitlines()) == 1


def test_a_prompt_is_tokenized_once(tiny_model, monkeypatch):
    """The slot counts a prompt's tokens before anything is fed; the completion reuses those tokens."""
    import llama_cpp

    calls: list[bytes] = []
    tokenize = llama_cpp.Llama.tokenize

    def counting(self, text, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(bytes(text))
        return tokenize(self, text, *args, **kwargs)

    monkeypatch.setattr(llama_cpp.Llama, "tokenize", counting)
    slot = Slot(str(tiny_model), {"n_ubatch": 16}, {"method": "rerope"}, log=io.StringIO())
    prompt = "Once upon a time there was a prompt " * 3
    for _ in range(2):  # the second time the engine is warm: still once
        calls.clear()
        result = slot.run(lambda llm: llm.create_completion(prompt, max_tokens=2, temperature=0))
        assert calls.count(prompt.encode("utf-8")) == 1
        assert result["usage"]["prompt_tokens"] == slot.llm.last_prompt_tokens
    chat = slot.run(lambda llm: llm.create_chat_completion(messages=[{"role": "user", "content": "hi"}], max_tokens=2))
    assert chat["usage"]["prompt_tokens"] == slot.llm.last_prompt_tokens
    slot.unload()
