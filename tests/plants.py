"""Wrong implementations that a weaker suite let through, planted one at a time: each must
make the suite fail.

    python -m tests.plants          # every plant, the tests that fail for each (~10 min on 2 cores)

Each plant edits one line of a copy of ``src/`` (under a temporary folder, put first on
PYTHONPATH) and runs the fast scheme tests against it; the output names the tests that
fail. A plant no test notices prints "0 failed" and makes the command exit 1.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = str(Path(__file__).resolve().parents[1])
PLANTS = [
    ("ALiBi sign flipped (+slope|i-j|)", "src/posenc/encodings/position_bias.py",
     "return -self.slopes[:, None] * rel.abs()", "return self.slopes[:, None] * rel.abs()"),
    ("ALiBi slopes on the wrong heads", "src/posenc/encodings/position_bias.py",
     "return -self.slopes[:, None] * rel.abs()", "return -self.slopes.flip(0)[:, None] * rel.abs()"),
    ("ALiBi one-sided in bidirectional attention", "src/posenc/encodings/position_bias.py",
     "return -self.slopes[:, None] * rel.abs()", "return -self.slopes[:, None] * rel.clamp(max=0).abs()"),
    ("T5 with self.causal for not self.causal", "src/posenc/encodings/position_bias.py",
     "t5_relative_bucket(rel, not self.causal,", "t5_relative_bucket(rel, self.causal,"),
    ("T5 with rel negated", "src/posenc/encodings/position_bias.py",
     "t5_relative_bucket(rel, not self.causal,", "t5_relative_bucket(-rel, not self.causal,"),
    ("learned table: one vector for every position", "src/posenc/encodings/absolute.py",
     "LAST:return self.table[pos].to(x.dtype)", "return self.table[pos * 0].to(x.dtype)"),
    ("partial RoPE: unrotated features zeroed", "src/posenc/encodings/rotary.py",
     "return torch.cat((rotated, rest), dim=-1)", "return torch.cat((rotated, rest * 0), dim=-1)"),
    ("partial RoPE: unrotated features moved first", "src/posenc/encodings/rotary.py",
     "return torch.cat((rotated, rest), dim=-1)", "return torch.cat((rest, rotated), dim=-1)"),
    ("sliding window scores each window's first tokens", "src/posenc/evaluate.py",
     "keep = cols[None, :] >= first[:, None]", "keep = cols[None, :] < (length - first)[:, None]"),
    ("attention dropout applied in eval (fused route)", "src/posenc/attention/fused.py",
     "drop = attn.dropout if attn.training else 0.0", "drop = attn.dropout"),
    ("attention dropout applied in eval (probabilities route)", "src/posenc/attention/layer.py",
     "self.dropout if self.training else 0.0,\n                          self.training)",
     "self.dropout,\n                          True)"),
    ("a layer's own bias block lets each row see the next key", "src/posenc/attention/blocks.py",
     "later = pos[r0 + 1 : c1][None, :] > pos[r0:r1, None]", "later = pos[r0 + 1 : c1][None, :] > pos[r0:r1, None] + 1"),
    ("FIRE's pieces: a rising unit active one segment early", "src/posenc/encodings/position_bias.py",
     "torch.where(rising, seg > rank, seg <= rank)", "torch.where(rising, seg >= rank, seg <= rank)"),
    ("FIRE's pieces: slope gradients summed into the intercepts", "src/posenc/encodings/position_bias.py",
     "per_segment[:H], per_segment[H:]", "per_segment[H:], per_segment[:H]"),
    ("FIRE's segments a row at a time: counted one key late", "src/posenc/encodings/position_bias.py",
     "torch.cumsum(ends[:, :m], 1", "torch.cumsum(ends[:, 1:], 1"),
    ("FIRE's row normaliser on one key too many", "src/posenc/encodings/position_bias.py",
     "left = min(m, max(0, int(qp.min() - kp[0]) + 1))", "left = min(m, max(0, int(qp.min() - kp[0]) + 2))"),
    ("a value term's share of dP left out of the blockwise backward", "src/posenc/attention/recomputed.py",
     "dp += g[0]", "dp += 0"),
    ("a value term's blockwise forward one distance off", "src/posenc/attention/recomputed.py",
     "scheme.value_term(p, pos[r0:r1], pos[:c1])", "scheme.value_term(p, pos[r0:r1] + 1, pos[:c1])"),
    ("MLM random replacement draws special tokens", "src/posenc/data.py",
     "torch.randint(len(SPECIAL_TOKENS), self.vocab_size,", "torch.randint(0, self.vocab_size,"),
]
TESTS = ["tests/test_encodings.py", "tests/test_attention.py", "tests/test_references.py", "tests/test_evaluate.py",
         "tests/test_rope_scaling.py"]


def main() -> int:
    missed = []
    for title, path, old, new in PLANTS:
        with tempfile.TemporaryDirectory() as root:
            failed = plant(root, path, old, new)
        print(f"## {title}: {len(failed)} failed")
        by_test: dict[str, list[str]] = {}
        for f in failed:
            by_test.setdefault(f.split("[")[0], []).append(f)
        for t, ids in by_test.items():
            print(f"   {t} ({len(ids)}), e.g. {ids[0]}")
        sys.stdout.flush()
        if not failed:
            missed.append(title)
    if missed:
        print("not noticed: " + "; ".join(missed))
    return 1 if missed else 0


def plant(root: str, path: str, old: str, new: str) -> list[str]:
    """The ids of the tests that fail with ``old`` replaced by ``new`` in a copy of ``path``."""
    shutil.copytree(f"{REPO}/src", f"{root}/src")
    shutil.copytree(f"{REPO}/conf", f"{root}/conf")
    text = Path(root, path).read_text()
    if old.startswith("LAST:"):
        old = old[5:]
        head, _, tail = text.rpartition(old)
        text = head + new + tail
    else:
        assert old in text, f"{path} no longer holds {old!r}: update the plant"
        text = text.replace(old, new, 1)
    Path(root, path).write_text(text)
    env = dict(os.environ, PYTHONPATH=f"{root}/src")
    where = subprocess.run([sys.executable, "-c", "import posenc; print(posenc.__file__)"], env=env,
                           capture_output=True, text=True, cwd=REPO).stdout.strip()
    assert where.startswith(root), f"the copy is not the one imported: {where}"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "--full", "-n0", "-p", "no:cacheprovider", "-k",
                        "not trains_on_real_text", *TESTS], env=env, capture_output=True, text=True, cwd=REPO)
    return re.findall(r"^FAILED (\S+)", r.stdout, re.M)


if __name__ == "__main__":
    sys.exit(main())
