"""farctx chat on the tiny model: piped stdin, a conversation past n_ctx_train, a loaded document."""

from __future__ import annotations

import io

from helpers import run_cli

import farctx
from farctx.chat import Chat, fixed_head_tokens, run_chat


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


def test_chat_cli_keeps_streamings_sinks_on_the_fixed_head(tiny_model):
    """The head column of the method table, not a list of method names: streaming's head is n_sink."""
    result = run_cli("chat", "-m", str(tiny_model), "--method", "streaming", "-n", "2", "--temp", "0",
                     "-sys", "You are terse.", stdin="Hi\n")
    assert result.returncode == 0, result.stderr
    assert f"n_sink {fixed_head_tokens(str(tiny_model), 'You are terse.')})" in result.stderr



def test_fixed_head_is_what_every_prompt_starts_with(tiny_model):
    with_system = fixed_head_tokens(str(tiny_model), "You are a very helpful assistant who answers briefly.")
    short_system = fixed_head_tokens(str(tiny_model), "Hi.")
    assert with_system > short_system > 0


def test_lminf_conversation_runs_past_n_ctx_train_in_constant_memory(tiny_model):
    head = fixed_head_tokens(str(tiny_model), "Answer.")
    llm = farctx.Llama(str(tiny_model), method="lminf", n_global=head, n_ubatch=16)
    chat = Chat(llm, system="Answer.", sampling={"max_tokens": 4, "temperature": 0})
    cache = llm.n_ctx()
    for i in range(4):
        chat.turn(f"Tell me about item {i} " + "and more " * 8, io.StringIO())
        assert llm.n_ctx() == cache and llm.stats()["n_cells_used"] <= cache
    stats = llm.stats()
    assert stats["n_past"] > 4 * 32  # the conversation is several times the trained context
    assert len(chat.messages) == 1 + 2 * 4 and chat.messages[-1]["role"] == "assistant"


def test_document_goes_before_the_first_message(tiny_model):
    llm = farctx.Llama(str(tiny_model), method="lminf", n_ubatch=16)
    chat = Chat(llm, document="A long document.", sampling={"max_tokens": 2, "temperature": 0})
    chat.turn("Summarise it.", io.StringIO())
    chat.turn("Thanks.", io.StringIO())
    assert chat.messages[0] == {"role": "user", "content": "A long document.\n\nSummarise it."}
    assert chat.messages[2] == {"role": "user", "content": "Thanks."}


def test_vanilla_says_when_the_conversation_does_not_fit_and_goes_on(tiny_model):
    llm = farctx.Llama(str(tiny_model), method="vanilla", n_ctx=256, n_ubatch=16)
    chat = Chat(llm, sampling={"max_tokens": 2, "temperature": 0})
    out, err = io.StringIO(), io.StringIO()
    run_chat(chat, io.StringIO("word " * 400 + "\nshort\n"), out, err)
    assert "no longer fits the cache" in err.getvalue() and "context window of 256" in err.getvalue()
    assert [m["content"] for m in chat.messages if m["role"] == "user"] == ["short"]
    assert len(out.getvalue().splitlines()) == 1
