"""How schemes are drawn (analysis.style), the extrapolation figure by family
(analysis.extrapolation) and the benchmark figure's axes (posenc.bench.figure)."""

from __future__ import annotations

import itertools
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from analysis import style
from posenc import CONFIG_DIR
from posenc.evaluate import write_results

REPO = Path(__file__).resolve().parents[1]
#: the schemes of conf/encoding and RoPE's context-extension rows of the study
CONF_SCHEMES = ["alibi", "cape", "fire", "fixed_bidirectional", "kerple", "learned", "none", "rope", "shaw",
                "sinusoidal", "skew", "t5_bias", "transformer_xl", "tupe", "xpos"]  # fmt: skip
ROPE_ROWS = ["rope+pi", "rope+ntk", "rope+yarn", "rope+pi+ft4L"]
KNOWN = CONF_SCHEMES + ROPE_ROWS


def _conf_copy(tmp_path: Path, extra: dict[str, str]) -> Path:
    """A conf dir whose encoding/ is a copy of conf/encoding plus ``{name: _target_}``."""
    conf = tmp_path / "conf"
    shutil.copytree(Path(CONFIG_DIR) / "encoding", conf / "encoding")
    for name, target in extra.items():
        text = f"name: {name}\nscheme:\n  _target_: {target}\n  _partial_: true\n"
        (conf / "encoding" / f"{name}.yaml").write_text(text)
    return conf


def _key(s: style.Style) -> tuple:
    return (s.family, s.color, s.marker, s.dashes)


def test_known_schemes_keep_their_style_when_a_scheme_is_added(tmp_path):
    assert {p.stem for p in (Path(CONFIG_DIR) / "encoding").glob("*.yaml")} >= set(CONF_SCHEMES)
    before = {n: _key(s) for n, s in style.styles(KNOWN).items()}
    conf = _conf_copy(tmp_path, {"sandwich": "posenc.encodings.ALiBi"})
    with_new = style.styles(KNOWN + ["sandwich"], conf_dir=conf)
    assert {n: _key(with_new[n]) for n in KNOWN} == before
    # the new scheme's family comes from its class; its slot is none of the known ones
    assert with_new["sandwich"].family == "position bias" and not with_new["sandwich"].known
    assert (with_new["sandwich"].color, with_new["sandwich"].marker) not in {(c, m) for _f, c, m, _d in before.values()}
    # without a YAML it is "other" (grey), and RoPE's rows are rotary and dashed
    assert style.style_of("sandwich").family == style.OTHER
    assert all(style.style_of(r).family == "rotary" and style.style_of(r).dashes for r in ROPE_ROWS)
    assert style.style_of("rope").dashes is None


def test_table_family_is_the_class_family(tmp_path):
    for name in KNOWN:
        assert style.TABLE[name][0] == style.family_of(name), name
    # a table entry that disagrees with the class is refused, not drawn in the wrong hue
    conf = _conf_copy(tmp_path, {"alibi": "posenc.encodings.RoPE"})
    with pytest.raises(ValueError, match="alibi.*rotary"):
        style.style_of("alibi", conf_dir=conf)


def test_no_two_schemes_share_colour_and_marker_and_shades_differ():
    unknown = ["sandwich", "mystery", "alibi+window"] + [f"rope+rule{i}" for i in range(20)]
    st = style.styles(KNOWN + unknown)
    pairs = [(s.color, s.marker) for s in st.values()]
    assert len(set(pairs)) == len(pairs)
    # unknown slots depend on the set only, not on the order, and never move a known scheme
    again = style.styles(list(reversed(KNOWN + unknown)))
    assert {n: _key(s) for n, s in again.items()} == {n: _key(s) for n, s in st.items()}
    assert {n: _key(st[n]) for n in KNOWN} == {n: _key(s) for n, s in style.styles(KNOWN).items()}
    # within a family: a marker each, and shades clearly apart (CIE76 distance in Lab)
    for fam in style.FAMILIES:
        members = [n for n in KNOWN if st[n].family == fam]
        assert len({st[n].marker for n in members}) == len(members), fam
        for a, b in itertools.combinations(members, 2):
            assert _delta_e(st[a].color, st[b].color) > 15, (a, b)
        # an unknown scheme's shade is no near-copy of a known one of its family
        for spare in style.SPARE_SHADES[fam]:
            assert min((_delta_e(spare, st[n].color) for n in members), default=99) > 13, (fam, spare)


def _delta_e(c1: str, c2: str) -> float:
    from matplotlib.colors import to_rgb

    def lab(c):
        rgb = np.array(to_rgb(c))
        rgb = np.where(rgb > 0.04045, ((rgb + 0.055) / 1.055) ** 2.4, rgb / 12.92)
        m = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]])
        xyz = m @ rgb / np.array([0.95047, 1.0, 1.08883])
        f = np.where(xyz > 0.008856, np.cbrt(xyz), 7.787 * xyz + 16 / 116)
        return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])

    return float(np.linalg.norm(lab(c1) - lab(c2)))


# ---------------------------------------------------------------- extrapolation figure
def _renderer(fig):
    """Draw a (possibly closed) figure on an Agg canvas; its renderer, for extents."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def _rows(scheme, seed, ppl_by_len, train_len=4):
    return [{"scheme": scheme, "seed": seed, "train_len": train_len, "eval_len": t, "method": "nonoverlapping",
             "ppl": p, "note": "" if math.isfinite(p) else "not applicable"}
            for t, p in ppl_by_len.items()]  # fmt: skip


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    d = tmp_path_factory.mktemp("results")
    curves = {"none": (5.0, 6.0, 7.0), "sinusoidal": (3.0, 9.0, 20.0), "learned": (4.0, math.nan, math.nan),
              "rope": (2.0, 4.0, 8.0), "rope+pi": (2.0, 6.0, 12.0), "alibi": (3.0, 3.0, 3.0),
              "shaw": (2.5, 2.6, 2.8)}  # fmt: skip
    files = []
    for scheme, (a, b, c) in curves.items():
        rows = []
        for seed in (0, 1):
            k = 1.0 + seed  # seed 1 doubles every perplexity: per-seed ratios equal the seed-0 ones
            rows += _rows(scheme, seed, {4: a * k, 8: b * k, 16: c * k})
        files += write_results(rows, d / scheme)[:1]
    # a scheme whose per-seed ratio differs from the ratio of the means: (4/2 + 6/4) / 2 = 1.75, not 10/6
    files += write_results(_rows("kerple", 0, {4: 2.0, 8: 4.0}) + _rows("kerple", 1, {4: 4.0, 8: 6.0}),
                           d / "kerple")[:1]  # fmt: skip
    return files


def _panels(fig):
    from analysis.extrapolation import PPL_LABEL, RATIO_ONE_GID, scheme_lines

    data = [ax for ax in fig.axes if scheme_lines(ax)]
    ratio = [ax for ax in data if any(ln.get_gid() == RATIO_ONE_GID for ln in ax.get_lines())]
    ppl = [ax for ax in data if ax not in ratio]
    assert all(ax.get_title() for ax in ppl) and all(ax.get_yscale() == "log" for ax in data)
    assert ppl[0].get_ylabel() == PPL_LABEL
    return ppl, ratio


def test_figure_has_a_column_per_family_with_the_reference_in_each(results, tmp_path):
    from analysis.extrapolation import line_schemes, plot, scheme_lines

    fig, out = plot(results, tmp_path / "fig")
    assert all(p.stat().st_size > 1000 for p in out)
    ppl, ratio = _panels(fig)
    families = ["absolute", "rotary", "position bias", "content-relative"]
    assert [ax.get_title() for ax in ppl] == [style.FAMILY_TITLES[f] for f in families]
    assert len(ratio) == len(ppl)
    members = {"absolute": ["sinusoidal", "learned"], "rotary": ["rope", "rope+pi"],
               "position bias": ["alibi", "kerple"], "content-relative": ["shaw"]}  # fmt: skip
    for fam, ax_p, ax_r in zip(families, ppl, ratio):
        assert line_schemes(ax_p) == line_schemes(ax_r) == ["none"] + members[fam]
        for ln in scheme_lines(ax_p):  # each line in its scheme's colour, the reference in grey
            name = ln.get_gid().split(":", 1)[1]
            if name != "none":
                assert ln.get_color() == style.style_of(name).color and ln.get_marker() == style.style_of(name).marker
    shared = ppl[0].get_shared_y_axes()  # one y axis along each row, another for the ratio row
    assert all(shared.joined(ppl[0], ax) for ax in ppl) and all(shared.joined(ratio[0], ax) for ax in ratio)
    assert not shared.joined(ppl[0], ratio[0])
    ax_r = ratio[families.index("position bias")]
    kerple = next(ln for ln in scheme_lines(ax_r) if ln.get_gid().endswith(":kerple"))
    assert list(kerple.get_xdata()) == [4, 8] and kerple.get_ydata()[1] == pytest.approx(1.75)
    learned = next(ln for ln in scheme_lines(ppl[0]) if ln.get_gid().endswith(":learned"))
    assert list(learned.get_xdata()) == [4]  # only its point at L
    assert "learned (L=4): not applicable at 8, 16" in "\n".join(t.get_text() for t in fig.texts)
    # the legends cover no panel
    renderer = _renderer(fig)
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    assert len(legends) == len(families)
    assert all("none (reference)" in [t.get_text() for t in lg.get_texts()] for lg in legends)
    for lg in legends:
        box = lg.get_window_extent(renderer)
        assert not any(box.overlaps(ax.get_window_extent(renderer)) for ax in ppl + ratio)


def test_figure_draws_only_the_schemes_asked_for(results, tmp_path):
    from analysis.extrapolation import line_schemes, plot
    from pipelines.extrapolation_figure import main

    fig, _ = plot(results, tmp_path / "sub", schemes=["rope", "alibi"])
    ppl, ratio = _panels(fig)
    assert [ax.get_title() for ax in ppl] == [style.FAMILY_TITLES["rotary"], style.FAMILY_TITLES["position bias"]]
    assert [line_schemes(ax) for ax in ppl] == [["none", "rope"], ["none", "alibi"]]
    with pytest.raises(ValueError, match=r"nope.*available: alibi, kerple, learned, none, rope"):
        plot(results, tmp_path / "bad", schemes=["rope", "nope"])
    assert main([str(f) for f in results] + ["--out", str(tmp_path / "cli"), "--schemes", "shaw"])[0].is_file()
    with pytest.raises(SystemExit):
        main([str(f) for f in results] + ["--out", str(tmp_path / "cli2"), "--schemes", "nope"])
    assert not (tmp_path / "cli2.png").exists()


# ---------------------------------------------------------------- benchmark figure
def _bench_figure(monkeypatch, tmp_path, res):
    from posenc.bench import figure

    figs = []
    monkeypatch.setattr(figure, "save_figure", lambda fig, stem: figs.append(fig) or [Path(stem)])
    assert figure.plot(res, tmp_path)
    return figs[0]


def _visible_ticks(ax):
    lo, hi = ax.get_ylim()
    return [t for t in ax.get_yticks() if lo <= t <= hi]


def test_bench_memory_axis_has_readable_ticks_and_legends_beside_the_panels(monkeypatch, tmp_path):
    res = json.loads((REPO / "figures" / "bench" / "bench.json").read_text())
    fig = _bench_figure(monkeypatch, tmp_path, res)
    mem = next(ax for ax in fig.axes if ax.get_ylabel().startswith("peak training memory"))
    ticks = _visible_ticks(mem)
    assert len(ticks) >= 3 and 1.0 in ticks
    renderer = _renderer(fig)
    labels = [t.get_text() for t in mem.get_yticklabels() if t.get_text()]
    assert len(labels) >= 3 and "1" in labels
    for ax in fig.axes:
        assert ax.get_legend() is not None
        assert not ax.get_legend().get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))
    # a narrow range (all within 1.0 to 1.2) still gets three labels
    for i, r in enumerate(res["summary"]):
        if r.get("mem_ratio"):
            r["mem_ratio"] = 1.0 + 0.2 * (i % 2)
    mem = next(ax for ax in _bench_figure(monkeypatch, tmp_path, res).axes if ax.get_ylabel().startswith("peak"))
    assert len(_visible_ticks(mem)) >= 3


def test_the_study_figure_names_the_tests_reference(results, tmp_path):
    """The study's figure draws the LM table's reference (here ``alibi``) and names it: grey and
    dotted in every other family's panel, as itself in its own family's, each legend saying
    "alibi (the tests' reference)"; NoPE, no longer the reference, gets its own column; the
    legends cover no panel and no other legend."""
    from analysis.extrapolation import REFERENCE_COLOR, line_schemes, plot, scheme_lines

    fig, _ = plot(results, tmp_path / "fig", reference="alibi", reference_label="the tests' reference")
    ppl, ratio = _panels(fig)
    families = ["none", "absolute", "rotary", "position bias", "content-relative"]
    assert [ax.get_title() for ax in ppl] == [style.FAMILY_TITLES[f] for f in families]
    for fam, ax in zip(families, ppl):
        drawn = line_schemes(ax)
        if fam == "position bias":
            assert drawn == ["alibi", "kerple"]  # itself, in its colour
            alibi = next(ln for ln in scheme_lines(ax) if ln.get_gid().endswith(":alibi"))
            assert alibi.get_color() == style.style_of("alibi").color
        else:
            assert drawn[0] == "alibi" and scheme_lines(ax)[0].get_color() == REFERENCE_COLOR
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    assert len(legends) == len(families)
    assert all("alibi (the tests' reference)" in [t.get_text() for t in lg.get_texts()] for lg in legends)
    assert "grey dotted: alibi, the tests' reference" in "\n".join(t.get_text() for t in fig.texts)
    renderer = _renderer(fig)
    boxes = [lg.get_window_extent(renderer) for lg in legends]
    for i, box in enumerate(boxes):
        assert not any(box.overlaps(ax.get_window_extent(renderer)) for ax in ppl + ratio)
        assert not any(box.overlaps(other) for other in boxes[i + 1:])


def test_the_committed_study_figure_is_drawn_against_the_lm_tables_reference():
    """The figures stage passes the LM table's reference and says it is the tests' (dvc.yaml)."""
    import yaml

    stage = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["figures"]
    assert "--reference ${lm_table.reference}" in stage["cmd"] and "the tests' reference" in stage["cmd"]
    assert "lm_table.reference" in stage["params"]
