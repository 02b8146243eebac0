"""Pictures of results (relmql.output.plot): the three kinds, how the kind is chosen, the files
written, the errors, and the ways in: ``Result.plot``, ``relmql --plot`` and the shell's ``.plot``."""

from __future__ import annotations

import math

import pytest

import relmql
from relmql.cli import main
from relmql.errors import Error
from relmql.output.plot import MAX_BARS, figure, plot
from relmql.stats import Estimate, wilson

COLUMNS = ("gender", "field", "p")
ROWS = [("man", "art", 0.1), ("man", "science", 0.3), ("woman", "art", 0.2), ("woman", "science", 0.05)]
TINY = ["--model", "tiny-gpt2", "--dtype", "float32", "--no-progress"]
GROUPED = ("SELECT gender, field, count(*) AS n MATCHING 'The (?P<gender>man|woman) was in (?P<field>art|law)' "
           "SAMPLE 50 GROUP BY gender, field;")


def _estimate(k, n):
    lo, hi = wilson(k, n)
    return Estimate(k / n, lo, hi, exact=False, draws=n)


def _bars(ax):
    from matplotlib.container import BarContainer
    return [c for c in ax.containers if isinstance(c, BarContainer)]


# -- files

def test_png(tmp_path):
    path = tmp_path / "p.png"
    assert plot(COLUMNS, ROWS, str(path)) == "bar"
    assert path.read_bytes().startswith(b"\x89PNG")


def test_svg_keeps_title_labels_and_legend_as_text(tmp_path):
    path = tmp_path / "p.svg"
    plot(COLUMNS, ROWS, str(path), title="P(field | gender)")
    svg = path.read_text()
    assert "<svg" in svg
    for text in ("P(field | gender)", ">gender<", ">p<", ">art<", ">science<", ">man<", ">woman<", ">field<"):
        assert text in svg, text


def test_pdf_and_default_title(tmp_path):
    path = tmp_path / "p.pdf"
    plot(COLUMNS, ROWS, str(path))
    assert path.read_bytes().startswith(b"%PDF")
    fig, _ = figure(COLUMNS, ROWS)
    assert fig.axes[0].get_title() == "p by gender and field"


# -- bar

def test_bar_heights_groups_and_legend():
    fig, kind = figure(COLUMNS, ROWS[:3])  # (woman, science) missing: a zero-height bar
    ax = fig.axes[0]
    assert kind == "bar"
    heights = [p.get_height() for p in ax.patches]
    assert heights == [0.1, 0.2, 0.3, 0.0]  # series art (man, woman), then series science
    assert [t.get_text() for t in ax.get_xticklabels()] == ["man", "woman"]
    legend = ax.get_legend()
    assert legend.get_title().get_text() == "field"
    assert [t.get_text() for t in legend.get_texts()] == ["art", "science"]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("gender", "p")


def test_bar_puts_the_column_with_more_values_along_the_axis():
    rows = [(g, f"job{i}", 0.01 * i) for i in range(6) for g in ("man", "woman")]
    ax = figure(("gender", "job", "p"), rows)[0].axes[0]
    assert len(ax.get_xticklabels()) == 6 and ax.get_xlabel() == "job"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["man", "woman"]


def test_bar_log_scale_and_intervals():
    rows = [("art", "man", _estimate(12, 50)), ("art", "woman", _estimate(28, 50)),
            ("law", "man", _estimate(2, 50)), ("law", "woman", 0.0)]
    fig, _ = figure(("field", "gender", "p"), rows, log=True)
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    assert sum(not math.isnan(p.get_height()) for p in ax.patches) == 3  # no bar for 0 on a log scale
    bars = _bars(ax)
    assert bars[0].errorbar is not None
    segments = bars[0].errorbar.lines[2][0].get_segments()
    (_, lo), (_, hi) = segments[0]
    assert (lo, hi) == pytest.approx((rows[0][2].low, rows[0][2].high))
    assert "95% intervals" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_exact_values_have_no_error_bars():
    ax = figure(COLUMNS, [r[:2] + (Estimate(r[2]),) for r in ROWS])[0].axes[0]
    assert _bars(ax) and all(c.errorbar is None for c in _bars(ax))


def test_a_bar_per_rank_and_long_labels_are_cut_and_turned():
    rows = [(i + 1, "x" * 80 + str(i), 0.5 / (i + 1)) for i in range(5)]
    ax = figure(("rank", "label", "prob"), rows, "bar")[0].axes[0]
    labels = ax.get_xticklabels()
    assert all(len(t.get_text()) <= 32 and t.get_rotation() > 0 for t in labels)
    assert figure(("rank", "prob"), [(1, 0.5), (2, 0.25)], "bar")[0].axes[0].get_xlabel() == "rank"


# -- cumulative and cdf

def test_cumulative_counts_rows_and_distinct_texts():
    rows = [("a", 0.1), ("b", 0.2), ("a", 0.1), ("c", 0.3), ("b", 0.2)]
    times = [0.5, 1.0, 1.5, 2.0, 3.0]
    fig, kind = figure(("text", "prob"), rows, times=times)
    ax = fig.axes[0]
    assert kind == "cumulative"
    rows_line, distinct = ax.get_lines()
    assert rows_line.get_ydata()[-1] == 5 and distinct.get_ydata()[-1] == 3
    assert rows_line.get_xdata()[-1] == 3.0
    assert ax.get_xlabel() == "seconds since the query started"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["rows", "distinct text"]


def test_cdf_of_a_numeric_column_leaves_out_nulls():
    rows = [(3,), (None,), (1,), (2,), (2,)]
    fig, kind = figure(("edit_position",), rows)
    ax = fig.axes[0]
    assert kind == "cdf"
    (line,) = ax.get_lines()
    assert list(line.get_ydata()) == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert list(line.get_xdata()) == [1, 1, 2, 2, 3]
    assert ax.get_ylabel() == "fraction of rows ≤ x"
    assert "n = 4" in ax.get_legend().get_texts()[0].get_text()
    assert figure(("rank", "edit_position"), [(1, 5), (2, 7)], log=True)[0].axes[0].get_xscale() == "log"


# -- the choice of kind

@pytest.mark.parametrize("columns,rows,times,kind", [
    (COLUMNS, ROWS, None, "bar"),
    (("edits",), [(1,), (2,)], None, "cdf"),
    (("rank", "prob"), [(1, 0.5), (2, 0.2)], [0.1, 0.2], "cdf"),
    (("text", "prob"), [("a", 0.5), ("b", 0.2)], [0.1, 0.2], "cumulative"),  # raw text is not a category
    (("gender", "n"), [("man", 3)] * 2 + [("woman", 1)] * (MAX_BARS - 1), [0.1] * (MAX_BARS + 1), "cumulative"),
    (("x", "n"), [("a", 1)], [], "bar"),  # no kinds given: the values are numbers
])
def test_the_kind_is_chosen_from_the_columns(columns, rows, times, kind):
    assert figure(columns, rows, times=times)[1] == kind


def test_the_plans_kinds_decide_over_the_values():
    # numbers the plan calls text (a parameter, say) are categories; a number column with NULLs is numeric
    assert figure(("a", "b"), [(1, 3), (2, 4)], kinds=("text", "text"), times=[1, 2])[1] == "cumulative"
    assert figure(("a", "b"), [(1, 3), (2, 4)], kinds=("text", "number"))[1] == "bar"
    assert figure(("a", "n"), [("x", 1), ("y", None)], kinds=("text", "number"))[1] == "bar"


# -- errors

@pytest.mark.parametrize("args,kw,words", [
    ((COLUMNS, ROWS, "p.png", "bars"), {}, "did you mean bar?"),
    ((COLUMNS, ROWS, "p.jpg"), {}, ".png, .svg, .pdf"),
    ((COLUMNS, [], "p.png"), {}, "no rows"),
    ((("a", "b"), [("x", "y")], "p.png", "bar"), {}, "numeric"),
    ((("a", "b"), [("x", "y")], "p.png"), {}, "no plot kind fits"),
    ((("a", "b"), [(1, 2)], "p.png"), {}, "name the kind: cdf"),
    ((("a", "n"), [("x", i) for i in range(MAX_BARS + 1)], "p.png", "bar"), {}, f"at most {MAX_BARS} rows"),
    ((("a", "n"), [("x", 1), ("x", 2)], "p.png", "bar"), {}, "one row per bar"),
    ((("text", "n"), [("x", 1)], "p.png", "cumulative"), {}, "the time each row arrived"),
    ((("n",), [(None,)], "p.png", "cdf"), {"kinds": ("number",)}, "no values of n"),
    ((("n",), [(0,)], "p.png", "cdf"), {"log": True}, "positive"),
    ((("a", "n"), [("x", 0), ("y", 0)], "p.png", "bar"), {"log": True}, "a log scale needs positive values"),
])
def test_errors_are_one_clear_message(tmp_path, args, kw, words):
    columns, rows, name, *kind = args
    with pytest.raises(Error) as e:
        plot(columns, rows, str(tmp_path / name), *kind, **kw)
    assert words in e.value.render()
    assert not (tmp_path / name).exists()


def test_a_missing_folder_is_an_error(tmp_path):
    with pytest.raises(Error, match="cannot write") as e:
        plot(COLUMNS, ROWS, str(tmp_path / "no" / "p.png"))
    assert "folder" in e.value.hint


# -- the ways in

@pytest.fixture(scope="module")
def con():
    return relmql.connect(model="tiny-gpt2", dtype="float32")


def test_result_plot(con, tmp_path):
    result = con.sql(GROUPED)
    assert result.plot(str(tmp_path / "g.png")) == "bar"
    result = con.sql("SELECT text, prob MATCHING 'The (cat|dog|bird) (sat|ran)' PREFIX 'The'")
    assert result.plot(str(tmp_path / "t.svg")) == "cumulative"
    assert "6 rows" in (tmp_path / "t.svg").read_text()


def test_cli_plot_flag(capsys, tmp_path):
    target = tmp_path / "x.png"
    code = main([*TINY, "-c", "SELECT text, prob MATCHING 'a(b|c)d' SAMPLE 20;",
                 "-c", "SHOW MODELS; " + GROUPED, "--plot", str(target), "--format", "csv"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert target.read_bytes().startswith(b"\x89PNG")  # the first query's
    assert (tmp_path / "x-2.png").read_bytes().startswith(b"\x89PNG")  # the second's; SHOW is not plotted
    assert not (tmp_path / "x-3.png").exists()
    assert f"plot: wrote {target} (cumulative)" in out.err
    assert f"plot: wrote {tmp_path / 'x-2.png'} (bar)" in out.err
    assert "gender,field,n" in out.out


def test_cli_plot_passes_over_single_rows(capsys, tmp_path):
    target = tmp_path / "x.png"
    code = main([*TINY, "-c", "SELECT count(*) AS n MATCHING 'a(b|c)d' SAMPLE 5; " + GROUPED, "--plot", str(target),
                 "--format", "csv"])
    err = capsys.readouterr().err
    assert code == 0 and "plot: nothing to draw for a result of 1 row" in err
    assert f"plot: wrote {target} (bar)" in err and not (tmp_path / "x-2.png").exists()


def test_cli_plot_kind_and_log_scale(capsys, tmp_path):
    code = main([*TINY, "-c", GROUPED, "--plot", str(tmp_path / "x.svg"), "--plot-kind", "cdf", "--log-scale",
                 "--format", "csv"])
    assert code == 0
    assert "(cdf)" in capsys.readouterr().err


@pytest.mark.parametrize("target,kind,words", [("x.gif", None, "the file name must end in"),
                                               ("no/x.png", None, "cannot write"),
                                               ("x.png", "bar", "needs a numeric column")])
def test_cli_plot_errors(capsys, tmp_path, target, kind, words):
    args = ["--plot-kind", kind] if kind else []
    code = main([*TINY, "-c", "SELECT text MATCHING 'a(b|c)';" if kind else GROUPED,
                 "--plot", str(tmp_path / target), *args, "--format", "csv"])
    out = capsys.readouterr()
    assert code == 1 and "Traceback" not in out.err
    assert out.err.startswith("error: ") and words in out.err
    assert ("text" in out.out) == (kind is not None)  # a bad file name fails before the query runs


def test_repl_plot_command(tmp_path, monkeypatch):
    from test_repl import CTRL_D, drive
    monkeypatch.setenv("RELMQL_HISTORY", str(tmp_path / "history"))
    c = relmql.connect(model="tiny-gpt2", dtype="float32")
    png, svg = tmp_path / "a.png", tmp_path / "b.svg"
    _, screen = drive(c, f".plot {png}\r{GROUPED}\r.plot {png}\r.plot {svg} cdf log\r.plot {png} bars\r"
                         f".plot {tmp_path}/x.gif\r.help plot\r" + CTRL_D)
    assert "no result to plot yet; run a query first" in screen
    assert f"wrote {png} (bar)" in screen and png.read_bytes().startswith(b"\x89PNG")
    assert f"wrote {svg} (cdf)" in screen and "<svg" in svg.read_text()
    assert "did you mean bar?" in screen
    assert "the file name must end in" in screen
    assert ".plot FILE [bar|cumulative|cdf] [log]" in screen
    assert "Traceback" not in screen


def test_repl_plot_completion():
    from prompt_toolkit.completion import CompleteEvent
    from prompt_toolkit.document import Document

    from relmql.repl.commands import names
    from relmql.repl.completer import RelmqlCompleter
    completer = RelmqlCompleter({}, lambda: [], (), {}, names())

    def complete(text):
        return [c.text for c in completer.get_completions(Document(text), CompleteEvent(completion_requested=True))]

    assert ".plot" in complete(".pl")
    assert complete(".plot x.png c") == ["cumulative", "cdf"]
    assert complete(".plot x.png bar l") == ["log"]
