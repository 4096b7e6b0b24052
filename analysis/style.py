"""How a scheme is drawn, in every figure: the one place that says it.

A scheme's style is fixed and does not depend on which other schemes are drawn:

* its **family** (``posenc.encodings.base.FAMILIES``) gives the hue: ``none`` dark
  grey (the reference), ``absolute`` blues, ``rotary`` oranges and reds, ``position
  bias`` greens, ``content-relative`` purples; a name that no ``conf/encoding`` YAML
  describes is ``other``, in greys. The family is read from the scheme class, not
  from a list here: ``conf/encoding/<name>.yaml``'s ``_target_`` resolved with
  ``hydra.utils.get_class``, then ``PositionalScheme.family()``. A row named
  ``<scheme>+<rule>`` (``rope+pi``, ``rope+pi+ft4L``: a context-extension rule of
  RoPE) belongs to the family of the part before the first ``+`` and is dashed.
* the **shade and marker** within the family come from ``TABLE`` for the schemes
  the study knows. ``style_of`` checks that the table's family of a known scheme
  is the family its class reports, and raises if they disagree (the table is then
  out of date).
* a scheme that is not in the table gets a (shade, marker) slot chosen from its
  name alone (SHA-1 of the name, never Python's salted ``hash``) among the slots
  that its family's table entries leave free: shades no known scheme of any family
  uses, markers no known scheme of that family uses. Adding a scheme therefore
  never moves a known scheme's style, and an unknown scheme keeps its slot unless
  another unknown scheme of the same family hashes to the same slot; ``styles``
  then gives the slot to the name with the smaller SHA-1 and moves the other to
  the next free slot (deterministic, and it only ever moves unknown schemes).
  Figures should therefore ask ``styles(names)`` for all the schemes they draw at
  once; ``style_of(name)`` is the style of a name on its own.

    >>> from analysis.style import styles
    >>> s = styles(["none", "rope", "rope+pi"])
    >>> s["rope+pi"].family, s["rope+pi"].linestyle
    ('rotary', (0, (4.0, 1.5)))
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from posenc.encodings.base import FAMILIES

#: the family of names no conf/encoding YAML describes
OTHER = "other"
#: figure order of the families (``FAMILIES``, then ``other``)
FAMILY_ORDER = (*FAMILIES, OTHER)
#: display names of the families, for panel titles
FAMILY_TITLES = {
    "none": "none (NoPE)",
    "absolute": "absolute",
    "rotary": "rotary and its extensions",
    "position bias": "position bias",
    "content-relative": "content-relative",
    OTHER: "other (no conf YAML)",
}
#: the dash pattern of a context-extension row (``<scheme>+<rule>``)
EXTENSION_DASHES = (4.0, 1.5)
#: marker order: a family's table entries take markers from the front, the bulky
#: shapes first, so that where two schemes of a family coincide the later one's
#: (smaller-looking) marker sits inside the earlier one's
MARKERS = ("o", "s", "D", "^", "v", "P", "X", "<", ">", "h", "p", "*", "d")

#: the fixed style of every scheme the study knows: name -> (family, shade, marker).
#: Shades were chosen to be told apart by eye within a family (lightness and a step
#: of hue: navy / mid blue / cyan; red / maroon / light orange / brown / gold / pink;
#: green / light green / very dark green / olive / teal; purple / lavender / indigo /
#: magenta; at least 19 CIE76 units apart, which a test checks at > 15) and every
#: scheme of a family has its own marker.
TABLE: dict[str, tuple[str, str, str]] = {
    "none": ("none", "#4d4d4d", "o"),
    # absolute: blues
    "sinusoidal": ("absolute", "#08306b", "o"),
    "learned": ("absolute", "#4292c6", "s"),
    "cape": ("absolute", "#17becf", "D"),
    # rotary and RoPE's context-extension rows: oranges and reds
    "rope": ("rotary", "#d62728", "o"),
    "xpos": ("rotary", "#7f0000", "s"),
    "rope+pi": ("rotary", "#fd8d3c", "D"),
    "rope+ntk": ("rotary", "#a65628", "^"),
    "rope+yarn": ("rotary", "#e6ab02", "v"),
    "rope+pi+ft4L": ("rotary", "#f768a1", "P"),
    # position bias: greens
    "alibi": ("position bias", "#238b45", "o"),
    "t5_bias": ("position bias", "#74c476", "s"),
    "kerple": ("position bias", "#00441b", "D"),
    "fire": ("position bias", "#9ab51e", "^"),
    "tupe": ("position bias", "#1b9e77", "v"),
    # content-relative: purples
    "shaw": ("content-relative", "#6a3d9a", "o"),
    "skew": ("content-relative", "#9e9ac8", "s"),
    "transformer_xl": ("content-relative", "#2d004b", "D"),
    "fixed_bidirectional": ("content-relative", "#c51b7d", "^"),
}

#: shades that unknown schemes of a family draw from: the family's hue, picked from
#: matplotlib's sequential maps as far (CIE76, in Lab) from the family's table shades
#: as the hue allows, at least 13 units (a test checks it; greens are the most crowded)
SPARE_SHADES: dict[str, tuple[str, ...]] = {
    "none": ("#262626", "#000000"),
    "absolute": ("#afc1dd", "#1764ab", "#03456c"),
    "rotary": ("#fc9b7c", "#cb4b02", "#fb7252"),
    "position bias": ("#85cfbb", "#006428", "#5ebe9b"),
    "content-relative": ("#f994b1", "#840178", "#776cb1"),
    OTHER: ("#8c8c8c", "#b3b3b3", "#737373", "#cccccc"),
}


@dataclass(frozen=True)
class Style:
    """How one scheme is drawn."""

    name: str
    family: str
    color: str
    marker: str
    #: matplotlib dash pattern (on, off) in points, or None for a solid line
    dashes: tuple[float, float] | None
    #: True for a scheme of ``TABLE``; False for a slot chosen from the name
    known: bool

    @property
    def label(self) -> str:
        return self.name

    @property
    def linestyle(self):
        """A matplotlib ``linestyle``: ``"-"`` or ``(0, dashes)``."""
        return "-" if self.dashes is None else (0, self.dashes)

    def line_kws(self) -> dict:
        """Keyword arguments for ``ax.plot`` / ``sns.lineplot``."""
        return {"color": self.color, "marker": self.marker, "linestyle": self.linestyle}


def _conf_dir(conf_dir: str | os.PathLike | None) -> str:
    if conf_dir is None:
        from posenc import CONFIG_DIR

        conf_dir = CONFIG_DIR
    return str(Path(conf_dir).resolve())


def base_name(name: str) -> str:
    """The scheme part of a row name: ``rope+pi+ft4L`` -> ``rope``."""
    return name.split("+", 1)[0]


@functools.lru_cache(maxsize=None)
def _class_family(base: str, conf_dir: str) -> str | None:
    """The family of ``<conf_dir>/encoding/<base>.yaml``'s class, or None without that YAML."""
    path = Path(conf_dir) / "encoding" / f"{base}.yaml"
    if not base or not path.is_file():
        return None
    import yaml
    from hydra.utils import get_class

    cfg = yaml.safe_load(path.read_text()) or {}
    target = (cfg.get("scheme") or {}).get("_target_") if isinstance(cfg.get("scheme"), dict) else None
    target = target or cfg.get("_target_")
    if not target:
        raise ValueError(f"{path} names no scheme class (no scheme._target_)")
    try:
        cls = get_class(target)
    except Exception as e:  # noqa: BLE001 - the message names the file and the cause
        raise ValueError(f"{path}: cannot import its scheme class {target!r}: {e}") from e
    family = cls.family()
    if family not in FAMILIES:
        raise ValueError(f"{target}.family() returned {family!r}, not one of {FAMILIES}")
    return family


def family_of(name: str, conf_dir: str | os.PathLike | None = None) -> str:
    """The family of a scheme or ``<scheme>+<rule>`` row, from its class; ``other`` without a YAML."""
    return _class_family(base_name(name), _conf_dir(conf_dir)) or OTHER


def _sha(name: str) -> int:
    return int.from_bytes(hashlib.sha1(name.encode("utf-8")).digest()[:8], "big")


@functools.lru_cache(maxsize=None)
def _free_slots(family: str) -> tuple[tuple[str, str], ...]:
    """The (shade, marker) slots of a family that no known scheme uses: spare shades
    with the markers the family's table entries leave free first, then with the rest."""
    used_markers = [m for f, _c, m in TABLE.values() if f == family]
    free = [m for m in MARKERS if m not in used_markers]
    rest = [m for m in MARKERS if m in used_markers]
    shades = SPARE_SHADES[family]
    return tuple((c, m) for c in shades for m in free) + tuple((c, m) for c in shades for m in rest)


def _check_table() -> None:
    """The table itself: families, unique (shade, marker), spare shades unused."""
    seen: dict[tuple[str, str], str] = {}
    for name, (fam, color, marker) in TABLE.items():
        assert fam in FAMILIES, (name, fam)
        assert marker in MARKERS, (name, marker)
        assert (color, marker) not in seen, (name, seen.get((color, marker)))
        seen[(color, marker)] = name
    known_shades = {c for _f, c, _m in TABLE.values()}
    for fam, shades in SPARE_SHADES.items():
        assert not known_shades & set(shades), fam
    for fam in FAMILIES:
        markers = [m for f, _c, m in TABLE.values() if f == fam]
        assert len(markers) == len(set(markers)), fam


_check_table()


def _known(name: str, conf_dir: str) -> Style:
    fam, color, marker = TABLE[name]
    cls_fam = _class_family(base_name(name), conf_dir)
    if cls_fam is not None and cls_fam != fam:
        raise ValueError(
            f"analysis/style.py TABLE draws {name!r} as {fam!r} but its class "
            f"({conf_dir}/encoding/{base_name(name)}.yaml) is {cls_fam!r}: update TABLE"
        )
    return Style(name, fam, color, marker, EXTENSION_DASHES if "+" in name else None, True)


def _unknown(name: str, family: str, slot: tuple[str, str]) -> Style:
    return Style(name, family, slot[0], slot[1], EXTENSION_DASHES if "+" in name else None, False)


@functools.lru_cache(maxsize=None)
def _style_of(name: str, conf_dir: str) -> Style:
    if name in TABLE:
        return _known(name, conf_dir)
    family = _class_family(base_name(name), conf_dir) or OTHER
    slots = _free_slots(family)
    return _unknown(name, family, slots[_sha(name) % len(slots)])


def style_of(name: str, conf_dir: str | os.PathLike | None = None) -> Style:
    """The style of one scheme on its own (see ``styles`` for several at once).

    ``conf_dir`` is the Hydra config root holding ``encoding/`` (default: posenc's
    ``conf/``)."""
    return _style_of(str(name), _conf_dir(conf_dir))


@functools.lru_cache(maxsize=None)
def _styles(names: tuple[str, ...], conf_dir: str) -> tuple[tuple[str, Style], ...]:
    out = {n: _style_of(n, conf_dir) for n in names}
    taken = {(s.color, s.marker) for s in out.values() if s.known}
    # unknown names in SHA-1 order: the smaller hash keeps its slot, a later one probes on
    for n in sorted((n for n, s in out.items() if not s.known), key=lambda n: (_sha(n), n)):
        s = out[n]
        slots = _free_slots(s.family)
        i0 = slots.index((s.color, s.marker))
        for k in range(len(slots)):
            slot = slots[(i0 + k) % len(slots)]
            if slot not in taken:
                break
        else:
            raise ValueError(
                f"more than {len(slots)} unknown {s.family!r} schemes: add them to analysis/style.py TABLE"
            )
        taken.add(slot)
        out[n] = _unknown(n, s.family, slot)
    return tuple(out.items())


def styles(names: Iterable[str], conf_dir: str | os.PathLike | None = None) -> dict[str, Style]:
    """The styles of the schemes drawn together, in the order given (duplicates once).
    Known schemes get their ``TABLE`` style; unknown ones their hashed slot, moved on
    only when another unknown one of the same family holds it."""
    names = tuple(dict.fromkeys(str(n) for n in names))
    return dict(_styles(names, _conf_dir(conf_dir)))


def order(names: Iterable[str], conf_dir: str | os.PathLike | None = None) -> list[str]:
    """``names`` in figure order: by family (``FAMILY_ORDER``), then ``TABLE`` order, then by name."""
    rank = {n: i for i, n in enumerate(TABLE)}
    st = styles(names, conf_dir)
    return sorted(st, key=lambda n: (FAMILY_ORDER.index(st[n].family), rank.get(n, len(rank)), n))


def by_family(names: Sequence[str], conf_dir: str | os.PathLike | None = None) -> dict[str, list[str]]:
    """``{family: [names in figure order]}`` for the families present, in ``FAMILY_ORDER``."""
    st = styles(names, conf_dir)
    out: dict[str, list[str]] = {}
    for n in order(names, conf_dir):
        out.setdefault(st[n].family, []).append(n)
    return out
