"""PROMPT (raw text and chat templates), several models in one statement, and logprob_under():
rows and log-probabilities against direct float32 transformers scoring of the tokenizer's own
encoding (``apply_chat_template`` followed by the reply), and brute force over small languages."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import relmql

ROOT = Path(__file__).resolve().parents[1]
GEMMA_TEMPLATE = ROOT / "examples" / "templates" / "gemma3.jinja"
QUESTION = "What is the capital of France?"
TOL = 1e-4  # the bound on a reply's log-probability against direct scoring


@pytest.fixture(scope="module")
def con(smol, gemma):
    session = relmql.connect(model="smollm2-135m", dtype="float32")
    session.models.put("smollm2-135m", "cpu", "float32", smol)
    session.models.put("gemma3-270m", "cpu", "float32", gemma)
    return session


def direct(model, before, reply, end=None) -> float:
    """log P(reply (then ``end``) | before) from one plain float32 forward pass, summed in float64."""
    ids = list(before) + list(reply) + ([end] if end is not None else [])
    with torch.no_grad():
        logits = model.model(torch.tensor([ids])).logits[0].double()
    lp = torch.log_softmax(logits, -1).numpy()
    return float(sum(lp[i - 1, ids[i]] for i in range(len(before), len(ids))))


def chat_ids(tok, messages, template=None):
    """The prompt as transformers has it: apply_chat_template with the generation prompt, tokenized."""
    ids = tok.apply_chat_template(messages, chat_template=template, add_generation_prompt=True, tokenize=True,
                                  return_dict=False)
    return list(ids)


def oracle(model, messages, strings, end, template=None):
    """Every string of ``strings`` that has a tokenization after the prompt as the tokenizer
    encodes the rendered conversation followed by it, with that tokenization and its direct
    log-probability (with the end of turn ``end``), best first."""
    tok = model.tokenizer
    ids = chat_ids(tok, messages, template)
    text = tok.apply_chat_template(messages, chat_template=template, add_generation_prompt=True, tokenize=False)
    out = []
    for s in strings:
        full = tok.encode(text + s, add_special_tokens=False)
        if full[:len(ids)] != ids:  # the reply's first characters join the prompt's last token
            continue
        reply = full[len(ids):]
        out.append((direct(model, ids, reply, end), s, tuple(reply)))
    return sorted(out, reverse=True)


def small_language():
    return [w + c for w in ("", " ", "\n", "\n\n") for c in ("Paris", "London", "Rome")]


@pytest.mark.parametrize("which", ["smollm2-135m", "gemma3-270m"])
def test_a_chat_prompt_gives_the_rows_of_direct_scoring_of_the_rendered_conversation(con, smol, gemma, which):
    model = smol if which == "smollm2-135m" else gemma
    template = GEMMA_TEMPLATE.read_text() if which == "gemma3-270m" else None
    # SmolLM2 ends its turns with <|im_end|> (id 2), which eos means under its template; Gemma 3 270M
    # is a base model, whose <end_of_turn> is too improbable (e^-40) to hold to 1e-4 in float32
    end = 2 if which == "smollm2-135m" else None
    messages = [{"role": "user", "content": QUESTION}]
    using = "eos" if template is None else f"chat_template '{GEMMA_TEMPLATE}'"
    rows = con.sql(f"SELECT text, logprob, canonical, tokens FROM {which} "
                   "MATCHING '(|\\n|\\n\\n| )(Paris|London|Rome)' "
                   f"PROMPT chat('user', '{QUESTION}') USING {using}").fetchall()
    expected = oracle(model, messages, small_language(), end, template)
    assert [r[0] for r in rows] == [s for _, s, _ in expected]
    for (text, lp, canonical, tokens), (want, _, reply) in zip(rows, expected):
        assert tuple(tokens) == reply and canonical is True
        assert abs(lp - want) < TOL, (text, lp, want)
    if which == "gemma3-270m":  # Gemma's tokenizer reads "\n\n" as one token: after "model\n" a reply
        assert "\nParis" not in [r[0] for r in rows]  # that begins with "\n" has no tokenization of its own


def test_a_raw_prompt_is_read_after_the_start_token_and_joins_the_reply_as_the_tokenizer_does(con, smol):
    prompt = "The capital of France is"
    rows = con.sql(f"SELECT text, logprob, total_logprob, tokens, canonical MATCHING '( Paris| London|Paris)' "
                   f"PROMPT '{prompt}'").fetchall()
    vocab = smol.vocabulary
    before = [smol.bos_id] + vocab.encode(prompt)
    expected = []
    for s in (" Paris", " London", "Paris"):
        full = vocab.encode(prompt + s)
        if full[:len(before) - 1] == before[1:]:
            expected.append((direct(smol, before, full[len(before) - 1:]), s))
    assert [r[0] for r in rows] == [s for _, s in sorted(expected, reverse=True)]
    for text, lp, total, tokens, canonical in rows:
        want = dict((s, v) for v, s in expected)[text]
        assert abs(lp - want) < TOL and lp == total  # no PREFIX: the whole reply is the completion
        assert canonical is True


def test_prefix_after_a_prompt_total_is_the_whole_reply_and_the_prompt_column_shows_it(con, smol):
    rows = con.sql(f"SELECT text, prefix, logprob, total_logprob, prompt MATCHING 'The capital is (Paris|Rome)' "
                   f"PREFIX 'The capital is' PROMPT chat('user', '{QUESTION}') USING eos").fetchall()
    tok = smol.tokenizer
    messages = [{"role": "user", "content": QUESTION}]
    ids = chat_ids(tok, messages)
    rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert {r[0] for r in rows} == {"The capital is Paris", "The capital is Rome"}
    for text, prefix, lp, total, prompt in rows:
        assert prompt == rendered and prefix == "The capital is"
        pre = tok.encode(rendered + prefix, add_special_tokens=False)[len(ids):]
        comp = tok.encode(text[len(prefix):], add_special_tokens=False)
        assert abs(total - direct(smol, ids, pre + comp, 2)) < TOL
        assert abs(lp - (direct(smol, ids, pre + comp, 2) - direct(smol, ids, pre))) < TOL


def test_sampling_and_probability_under_a_chat_prompt_match_direct_scoring(con, smol):
    messages = [{"role": "user", "content": QUESTION}]
    ids = chat_ids(smol.tokenizer, messages)
    language = ["Paris", "London", "Rome", "Paris.", "London.", "Rome."]
    total = sum(math.exp(direct(smol, ids, smol.tokenizer.encode(s, add_special_tokens=False), 2))
                for s in language)
    p, = con.sql(f"SELECT probability() MATCHING '(Paris|London|Rome)\\.?' PROMPT chat('user', '{QUESTION}') "
                 f"USING eos").fetchone()
    assert p == pytest.approx(total, rel=1e-3)
    rows = con.sql(f"SELECT text, logprob MATCHING '(Paris|London|Rome)\\.?' PROMPT chat('user', '{QUESTION}') "
                   f"USING eos SAMPLE 5").fetchall()
    assert len(rows) == 5
    for text, lp in rows:  # a drawn row's logprob is the model's own
        assert abs(lp - direct(smol, ids, smol.tokenizer.encode(text, add_special_tokens=False), 2)) < TOL


def test_a_conversation_ending_with_the_assistant_s_turn_is_continued(con, smol):
    messages = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": "The capital is"}]
    tok = smol.tokenizer
    rendered = tok.apply_chat_template(messages, continue_final_message=True, tokenize=False)
    assert rendered.endswith("The capital is")
    rows = con.sql("SELECT text, logprob, prompt MATCHING ' (Paris|Rome)' PROMPT chat(:m)",
                   params={"m": messages}).fetchall()
    ids = tok.encode(rendered, add_special_tokens=False)
    assert [r[0] for r in rows] == [" Paris", " Rome"]
    for text, lp, prompt in rows:
        assert prompt == rendered
        assert abs(lp - direct(smol, ids, tok.encode(rendered + text, add_special_tokens=False)[len(ids):])) < TOL


def test_a_dataset_prompts_each_row_with_its_own_question(con, smol, tmp_path):
    data = tmp_path / "questions.jsonl"
    questions = ["What is the capital of France?", "What is the capital of Italy?"]
    data.write_text("".join(json.dumps({"question": q}) + "\n" for q in questions))
    rows = con.sql(f"SELECT :row_number, text, logprob MATCHING '(Paris|Rome)' PROMPT chat('user', :question) "
                   f"USING eos LIMIT 1 FOR EACH ROW IN '{data}'").fetchall()
    assert [r[0] for r in rows] == [1, 2]
    for (n, text, lp), q in zip(rows, questions):
        ids = chat_ids(smol.tokenizer, [{"role": "user", "content": q}])
        best = max((direct(smol, ids, smol.tokenizer.encode(s, add_special_tokens=False), 2), s)
                   for s in ("Paris", "Rome"))
        assert text == best[1] and abs(lp - best[0]) < TOL


def test_from_several_models_runs_the_query_on_each_and_names_the_model(con):
    q = "MATCHING ' (Paris|London|Rome)' PROMPT 'The capital of France is' LIMIT 2"
    both = con.sql(f"SELECT model, text, logprob FROM smollm2-135m, gemma3-270m {q}").fetchall()
    one = {m: con.sql(f"SELECT text, logprob FROM {m} {q}").fetchall() for m in ("smollm2-135m", "gemma3-270m")}
    assert both == [("smollm2-135m", *r) for r in one["smollm2-135m"]] + [("gemma3-270m", *r) for r in
                                                                         one["gemma3-270m"]]
    counts = con.sql(f"SELECT model, count(*) AS n FROM smollm2-135m, gemma3-270m {q} GROUP BY model").fetchall()
    assert sorted(counts) == [("gemma3-270m", 2), ("smollm2-135m", 2)]
    params = con.sql("SELECT model, text FROM :ms " + q, params={"ms": ["gemma3-270m", "smollm2-135m"]}).fetchall()
    assert [r[0] for r in params] == ["gemma3-270m"] * 2 + ["smollm2-135m"] * 2
    assert con.sql("FROM :ms " + q, params={"ms": ["gemma3-270m", "smollm2-135m"]}).columns[0] == "model"


def test_probability_per_model_and_a_test_across_models(con):
    rows = con.sql("SELECT model, probability() AS p FROM smollm2-135m, gemma3-270m MATCHING ' (Paris|London)' "
                   "PROMPT 'The capital of France is' GROUP BY model").fetchall()
    alone = {m: con.sql(f"SELECT probability() FROM {m} MATCHING ' (Paris|London)' "
                        "PROMPT 'The capital of France is'").fetchone()[0] for m in ("smollm2-135m", "gemma3-270m")}
    assert dict(rows) == pytest.approx(alone, rel=1e-9)
    test = con.sql("SELECT model, group(1) AS city, sum(prob) AS p FROM smollm2-135m, gemma3-270m "
                   "MATCHING ' (Paris|London|Rome)' PROMPT 'The capital of France is' GROUP BY model, city "
                   "TEST INDEPENDENCE OF model, city")
    assert len(test.fetchall()) == 6 and test.test is not None and 0 <= test.test.p_value <= 1


def test_logprob_under_scores_the_reply_with_the_other_model(con, smol, gemma):
    rows = con.sql("SELECT text, logprob, logprob_under('smollm2-135m') AS own, logprob_under('gemma3-270m') AS g, "
                   "prob_under('gemma3-270m') AS pg, logprob - logprob_under('gemma3-270m') AS ratio "
                   "FROM smollm2-135m MATCHING ' (Paris|London)' PROMPT 'The capital of France is'").fetchall()
    assert len(rows) == 2
    for text, lp, own, g, pg, ratio in rows:
        assert own == pytest.approx(lp, abs=1e-6)  # the model's own score of its canonical row
        before = [gemma.bos_id] + gemma.vocabulary.encode("The capital of France is")
        full = gemma.vocabulary.encode("The capital of France is" + text)
        assert abs(g - direct(gemma, before, full[len(before) - 1:])) < TOL
        assert pg == pytest.approx(math.exp(g)) and ratio == pytest.approx(lp - g)
    chat = con.sql(f"SELECT text, logprob_under('gemma3-270m') AS g FROM smollm2-135m MATCHING '(Paris|Rome)' "
                   f"PROMPT chat('user', '{QUESTION}') USING chat_template '{GEMMA_TEMPLATE}'").fetchall()
    ids = chat_ids(gemma.tokenizer, [{"role": "user", "content": QUESTION}], GEMMA_TEMPLATE.read_text())
    for text, g in chat:  # the prompt rendered for Gemma by the template, the reply in Gemma's tokens
        reply = gemma.tokenizer.encode(text, add_special_tokens=False)
        assert abs(g - direct(gemma, ids, reply)) < TOL


def test_explain_shows_the_rendered_prompt_its_tokens_and_the_end_of_turn(con):
    text = "\n".join(r[0] for r in con.sql(f"EXPLAIN SELECT text, logprob_under('gemma3-270m') FROM smollm2-135m, "
                                           f"gemma3-270m MATCHING 'Paris' PROMPT chat('user', '{QUESTION}')"))
    assert "⟨<|im_start|>⟩user\\nWhat is the capital of France?⟨<|im_end|>⟩" in text
    assert "PROMPT        37 tokens (the model's chat template" in text
    assert "⟨<|im_end|>⟩ (id 2): eos means it" in text
    assert "runs on each of smollm2-135m, gemma3-270m" in text and "logprob_under() loads gemma3-270m" in text


@pytest.mark.parametrize("sql, message", [
    ("MATCHING 'a' PROMPT chat('usr', 'hi')", "unknown role 'usr'; a role is one of system, user, assistant"),
    ("MATCHING 'a' PROMPT chat(:m)", "chat() needs at least one message: the conversation is empty"),
    ("MATCHING 'a' PROMPT chat('user')", "chat() of one argument takes a list of {role, content} messages"),
    ("MATCHING 'a' PROMPT chat('user', 'a', 'system')", "chat() takes role and content pairs"),
    ("SELECT chat('user', 'x') MATCHING 'a'", "chat() writes a conversation: it is the value of PROMPT"),
    ("FROM smollm2-135m, 'smollm2-135m' MATCHING 'a'", "FROM names the model 'smollm2-135m' twice"),
    ("FROM smollm2-135m, gemma3-207m MATCHING 'a'", "unknown model 'gemma3-207m'; did you mean 'gemma3-270m'?"),
    ("FROM gemma3-270m MATCHING 'a' PROMPT chat('user', 'hi')", "the model 'gemma3-270m' has no chat template"),
    (f"FROM gemma3-270m MATCHING 'a' PROMPT chat('user', 'a', 'user', 'b') USING chat_template '{GEMMA_TEMPLATE}'",
     "cannot render this conversation: Conversation roles must alternate"),
    ("SELECT text, prob_under('./no-such-model') MATCHING 'a'", "no model directory './no-such-model'"),
    ("MATCHING 'a' PROMPT 'x' USING chat_template 'x.jinja'", "chat_template renders a conversation"),
])
def test_bad_prompts_and_model_lists_are_one_message_under_their_text(con, sql, message):
    with pytest.raises(relmql.Error) as info:
        con.sql(sql, params={"m": []}).fetchall()
    err = info.value
    assert message in err.message
    assert err.span is not None and err.span[1] > err.span[0]


def test_a_prompt_longer_than_the_context_names_both_numbers(con, tiny):
    con.models.put("tiny-gpt2", "cpu", "float32", tiny)
    with pytest.raises(relmql.Error, match=r"the prompt is [\d,]+ tokens, and tiny-gpt2 reads at most [\d,]+ "):
        con.sql(f"FROM tiny-gpt2 MATCHING ' a' PROMPT '{'word ' * 2000}'").fetchall()


def test_a_reply_that_would_join_the_prompt_s_last_token_is_said_so(con, capsys):
    assert con.sql("MATCHING 'a' PROMPT 'x'").fetchall() == []
    assert "the first characters of every string would join its last token" in capsys.readouterr().err


def test_edits_apply_to_the_prefix_and_never_to_the_prompt(con, smol):
    rows = con.sql(f"SELECT text, edits, total_logprob, prompt, tokens MATCHING 'The capital is (Paris|Rome)' "
                   f"PREFIX 'The capital is' PROMPT chat('user', '{QUESTION}') USING edits 1, edit_scope 'prefix' "
                   f"LIMIT 8").fetchall()
    tok = smol.tokenizer
    messages = [{"role": "user", "content": QUESTION}]
    rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = chat_ids(tok, messages)
    assert any(e == 1 for _, e, _, _, _ in rows) and any(e == 0 for _, e, _, _, _ in rows)
    for text, edits, total, prompt, tokens in rows:
        assert prompt == rendered  # the conversation is never edited
        assert abs(total - direct(smol, ids, tokens)) < TOL


def test_select_star_shows_the_model_and_the_prompt(con):
    res = con.sql("SELECT * FROM smollm2-135m, gemma3-270m MATCHING ' Paris' PROMPT 'The capital of France is'")
    dicts = res.to_dicts()
    assert list(dicts[0])[0] == "model" and list(dicts[0])[-1] == "prompt"
    assert [d["model"] for d in dicts] == ["smollm2-135m", "gemma3-270m"]
    assert all(d["prompt"] == "The capital of France is" for d in dicts)


def test_the_chat_example_plans(con):
    from relmql.plan import plan
    from relmql.syntax import parse
    text = (ROOT / "examples" / "chat.rql").read_text()
    statements = parse(text)
    assert len(statements) == 3
    for st in statements:
        assert plan(st, text, con.settings).prompt.is_chat


def test_a_sample_after_a_long_prompt_reads_up_to_the_context_and_totals_only_the_reply(con, tiny):
    """The prompt counts once against the model's context (tiny-gpt2 reads 512 tokens): a prompt of
    more than half of it leaves room for a reply; total_logprob is the reply's alone."""
    con.models.put("tiny-gpt2", "cpu", "float32", tiny)
    prompt = "the cat sat on the mat " * 50
    n = 1 + len(tiny.vocabulary.encode(prompt))
    assert 256 < n < 500
    rows = con.sql(f"SELECT text, logprob, total_logprob FROM tiny-gpt2 MATCHING ' [a-z]{{1,6}}' PROMPT '{prompt}' "
                   f"USING sampling exact, seed 1 SAMPLE 3").fetchall()
    assert len(rows) == 3
    for text, lp, total in rows:
        assert lp == pytest.approx(total, abs=1e-9)


def test_a_scoring_model_s_template_errors_name_that_model(con):
    with pytest.raises(relmql.Error) as info:
        con.sql("SELECT text, logprob_under('gemma3-270m') FROM smollm2-135m MATCHING 'Paris' "
                "PROMPT chat('user', 'hi')").fetchall()
    assert info.value.message.startswith("logprob_under('gemma3-270m'): the model 'gemma3-270m' has no chat template")


@pytest.mark.parametrize("family", ["smol_vocab", "gemma_vocab", "mistral_vocab", "llama3_vocab"])
def test_a_reply_after_a_context_has_the_tokens_the_tokenizer_gives_both(request, family):
    """The automaton after a prompt's tokens accepts exactly the reply's part of the tokenizer's
    encoding of prompt + reply, and nothing where that encoding changes the prompt's tokens
    (byte-level BPE, Gemma's and Mistral's SentencePiece-style BPE with and without a leading space)."""
    from relmql.automata import compile
    from relmql.syntax.regexes import escape
    vocab = request.getfixturevalue(family)
    for prompt in ["The capital of France is", "assistant\n", "x", "Hello  ", "1"]:
        context = tuple(vocab.encode(prompt))
        for reply in [" Paris", "Paris", "\nParis", "\n\nParis", " ", "  x", "23", "é!", "Paris\n"]:
            automaton = compile(escape(reply), vocab, context=context)
            got = [tokens for tokens, _ in automaton.paths()]
            full = tuple(vocab.encode(prompt + reply))
            want = [full[len(context):]] if full[:len(context)] == context else []
            assert got == want, (prompt, reply)
