"""Compiled kernels under a recompilation limit of their own, which fails loudly when reached.

torch.compile keeps one cache of compiled graphs per function (its code object) and, past
``torch._dynamo.config.recompile_limit`` (8) graphs, runs the function eagerly from then on,
with a log line and nothing else. For FlexAttention the eager function is the unfused kernel,
which builds B x H x T x T scores (1 GiB a head in float32 at T = 16,384); one compiled
``flex_attention`` serves every scheme, length, batch kind, dtype and grad mode of a process,
so a benchmark of several schemes reaches 8 long before it ends. ``recompile_limit()`` raises
the limit for the calls made inside it to ``RECOMPILE_LIMIT`` and has torch fail, rather than
fall back, past it: the caller gets ``RecompileLimitHit`` and chooses what to do (the flex route
takes the float-mask route; the rotation its eager form).

The limit is one no run of posenc reaches: a process compiles a kernel once per (scheme, grad
mode, dtype, kind of shape), the kinds of shape being few once torch has made the sizes dynamic
(tests/test_flex.py's slow test: eleven lengths and batches of an evaluation compile at most 8
graphs of one scheme, and nothing after its first six). The benchmark, the largest user (every
flex scheme, training and evaluation, in one process), would by that count need at most 7 x 2
x 8 = 112; the limit is 256, and the limit on all functions together 4096.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

#: compiled graphs one function may hold in this process (torch's default: 8)
RECOMPILE_LIMIT = 256
#: compiled graphs all functions together may hold (torch's default: 256)
ACCUMULATED_LIMIT = 4096


class RecompileLimitHit(RuntimeError):
    """A compiled kernel needed more graphs than ``RECOMPILE_LIMIT`` allows."""


def _settings(limit: int) -> dict:
    """The dynamo settings of ``recompile_limit``, by the names this torch has (``recompile_limit``
    and ``fail_on_recompile_limit_hit`` since 2.7, checked on 2.13; ``cache_size_limit`` and
    ``fail_on_cache_limit_hit`` before)."""
    config = torch._dynamo.config
    names = {"limit": ("recompile_limit", "cache_size_limit"),
             "total": ("accumulated_recompile_limit", "accumulated_cache_size_limit"),
             "fail": ("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit")}
    values = {"limit": limit, "total": max(ACCUMULATED_LIMIT, limit), "fail": True}
    out = {}
    for key, candidates in names.items():
        name = next((n for n in candidates if hasattr(config, n)), None)
        if name is not None:
            out[name] = values[key]
    return out


def _limit_error() -> type[BaseException]:
    exc = torch._dynamo.exc
    return getattr(exc, "FailOnRecompileLimitHit", None) or getattr(exc, "FailOnCacheLimitHit", RecompileLimitHit)


@contextmanager
def recompile_limit(limit: int | None = None):
    """Compiled calls inside may hold ``limit`` graphs (default ``RECOMPILE_LIMIT``, read at the
    call); past it they raise ``RecompileLimitHit`` instead of running eagerly."""
    n = RECOMPILE_LIMIT if limit is None else limit
    with torch._dynamo.config.patch(**_settings(n)):
        try:
            yield
        except _limit_error() as e:
            raise RecompileLimitHit(f"torch.compile reached its limit of {n} compiled "
                                    f"graphs for one function ({' '.join(str(e).split())[:200]})") from e
