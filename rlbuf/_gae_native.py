"""The native GAE kernel: a small C loop compiled on first use, loaded with ctypes.

One pass over CPU tensors in either layout, accumulating in float64. It is compiled with the
system C compiler (about half a second) into a private temporary directory, loaded, and the files
deleted; nothing is cached on disk. ``RLBUF_DISABLE_NATIVE=1`` turns it off, and
[`compute_gae`][rlbuf.gae.compute_gae] then uses its exact torch path. This is the same mechanism
``torch.compile`` uses on CPU, at a fraction of its compile time.
"""

from __future__ import annotations

import ctypes
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

import torch

from rlbuf.errors import ConfigError, DeviceError

if TYPE_CHECKING:
    from rlbuf.gae import _Rollout

Backend = Literal["auto", "native", "torch"]

# Below this many elements the torch path costs tens of microseconds: not worth a compiler run.
_NATIVE_MIN_NUMEL = 4096


# One template, instantiated for float and double (REAL, NAME). The kernel gets 9 views as
# (address, time stride, env stride) triples, strides in elements, address 0 when absent:
# reward, value, terminated, truncated, last_value (time stride 0), bootstrap_value, next_value,
# advantage, returns; all but last_value are [T, N] views. Accumulation is in double for both
# dtypes. Non-finite inputs are flagged in the same pass (status 1); the caller then locates and
# reports them and drops the fresh outputs, so nothing is returned from bad input.
_C_TEMPLATE = r"""
/* NaN or inf: x - x is NaN for those and 0 otherwise (no -ffast-math, so it is not folded). */
static int NAME_bad(REAL x) { return (x - x) != 0; }

/* One step of every env, rows contiguous along envs. Kept out of line with plain restrict
   parameters, every load unconditional and every choice a select, so that it vectorises. */
RLBUF_VECTOR static int NAME_step(int64_t N, const REAL *restrict r_t, const REAL *restrict v_t,
                     const REAL *restrict next_t, const REAL *restrict b_t,
                     const uint8_t *restrict te_t, const uint8_t *restrict tr_t,
                     REAL *restrict a_t, REAL *restrict g_t, double *restrict carry,
                     double g, double c_t) {
    int bad = 0;
    for (int64_t n = 0; n < N; ++n) {
        const REAL r = r_t[n], value = v_t[n], b = b_t[n], x = next_t[n];
        const int term = te_t[n] != 0, trunc = tr_t[n] != 0;
        const int stop = term | trunc, boot = trunc & !term;
        const double prev = carry[n];
        bad |= NAME_bad(r) | NAME_bad(value) | NAME_bad(x) | (boot & NAME_bad(b));
        const double next = boot ? (double)b : (double)x;
        const double delta = ((double)r + (term ? 0.0 : g * next)) - (double)value;
        const double a = delta + (stop ? 0.0 : c_t * prev);
        carry[n] = a;
        a_t[n] = (REAL)a;
        g_t[n] = (REAL)a + value;
    }
    return bad;
}

static int NAME_rows(int64_t T, int64_t N, const int64_t *v, double g, double c, double *carry) {
    const int64_t *rw = v, *vl = v + 3, *te = v + 6, *tr = v + 9, *lv = v + 12, *bs = v + 15,
                  *nx = v + 18, *ad = v + 21, *rt = v + 24;
    int bad = 0;
    for (int64_t t = T - 1; t >= 0; --t) {
        const REAL *v_t = (const REAL *)(intptr_t)vl[0] + t * vl[1];
        const uint8_t *te_t = (const uint8_t *)(intptr_t)te[0] + t * te[1];
        const REAL *next_t = nx[0] ? (const REAL *)(intptr_t)nx[0] + t * nx[1]
                           : t == T - 1 ? (const REAL *)(intptr_t)lv[0]
                           : v_t + vl[1];
        /* Without truncation flags (or bootstrap values) there is nothing to bootstrap from:
           point both at rows that make the selects pick the plain next value. */
        const uint8_t *tr_t = tr[0] ? (const uint8_t *)(intptr_t)tr[0] + t * tr[1] : te_t;
        const REAL *b_t = bs[0] && !nx[0] ? (const REAL *)(intptr_t)bs[0] + t * bs[1] : next_t;
        bad |= NAME_step(N, (const REAL *)(intptr_t)rw[0] + t * rw[1], v_t, next_t, b_t, te_t,
                         tr_t, (REAL *)(intptr_t)ad[0] + t * ad[1],
                         (REAL *)(intptr_t)rt[0] + t * rt[1], carry, g, t == T - 1 ? 0.0 : c);
    }
    return bad;
}

/* Any strides: env by env, sequential in time (TorchRL's [N, T] layout reads each env
   contiguously). Pointers walk back one step at a time; no index arithmetic in the loop. */
static int NAME_envs(int64_t T, int64_t N, const int64_t *v, double g, double c) {
    const int64_t *rw = v, *vl = v + 3, *te = v + 6, *tr = v + 9, *lv = v + 12, *bs = v + 15,
                  *nx = v + 18, *ad = v + 21, *rt = v + 24;
    const int use_next = nx[0] != 0, use_boot = bs[0] && !nx[0] && tr[0];
    /* Absent flags and values walk a present row instead; the selects ignore what they read. */
    const int64_t sr = rw[1], sv = vl[1], ste = te[1], str = tr[0] ? tr[1] : te[1],
                  snx = use_next ? nx[1] : sv, sbs = use_boot ? bs[1] : sv, sad = ad[1], srt = rt[1];
    int bad = 0;
    for (int64_t n = 0; n < N; ++n) {
#define LAST(view, type) ((type *)(intptr_t)(view)[0] + (T - 1) * (view)[1] + n * (view)[2])
        const REAL *r = LAST(rw, const REAL), *val = LAST(vl, const REAL);
        const uint8_t *term_p = LAST(te, const uint8_t);
        const uint8_t *trunc_p = tr[0] ? LAST(tr, const uint8_t) : term_p;
        const REAL *next_p = use_next ? LAST(nx, const REAL) : val;
        const REAL *boot_p = use_boot ? LAST(bs, const REAL) : val;
        REAL *adv = LAST(ad, REAL), *ret = LAST(rt, REAL);
#undef LAST
        /* x: V(next observation) of step t, unless step t is a timeout. */
        REAL x = use_next ? *next_p : ((const REAL *)(intptr_t)lv[0])[n * lv[2]];
        double carry = 0.0, trace = 0.0;
        for (int64_t t = T - 1; t >= 0; --t) {
            const int term = *term_p != 0, stop = term | (*trunc_p != 0);
            const int boot = use_boot && stop && !term;
            const REAL reward = *r, value = *val, b = *boot_p;
            const REAL next = boot ? b : x;
            /* The same values are checked as in the row loop. */
            bad |= NAME_bad(reward) | NAME_bad(value) | NAME_bad(x) | (boot && NAME_bad(b));
            const double delta = ((double)reward + (term ? 0.0 : g * (double)next)) - (double)value;
            carry = delta + (stop ? 0.0 : trace * carry);
            trace = c;
            *adv = (REAL)carry;
            *ret = (REAL)carry + value;
            r -= sr; val -= sv; term_p -= ste; trunc_p -= str; boot_p -= sbs; adv -= sad; ret -= srt;
            if (use_next) {
                next_p -= snx;
                x = t ? *next_p : 0;
            } else {
                x = value;
            }
        }
    }
    return bad;
}

/* 0: done; 1: a non-finite input was read (outputs are garbage); -1: out of memory. */
int NAME(int64_t T, int64_t N, const int64_t *v, double g, double lambda) {
    int rows = 1;
    for (int k = 0; k < 9; ++k)
        if (v[3 * k] && v[3 * k + 2] != 1) rows = 0;
    if (!rows) return NAME_envs(T, N, v, g, g * lambda);
    double *carry = calloc((size_t)(N > 0 ? N : 1), sizeof(double));
    if (!carry) return -1;
    const int bad = NAME_rows(T, N, v, g, g * lambda, carry);
    free(carry);
    return bad;
}
"""

_C_HEADER = r"""
#include <stdint.h>
#include <stdlib.h>

/* One copy of the step loop per x86-64 level (AVX-512, AVX2, SSE2), picked when loaded. */
#if defined(RLBUF_TARGET_CLONES) && defined(__x86_64__)
#define RLBUF_VECTOR __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define RLBUF_VECTOR
#endif
"""

_C_SOURCE = (
    _C_HEADER
    + _C_TEMPLATE.replace("NAME", "rlbuf_gae_f32").replace("REAL", "float")
    + _C_TEMPLATE.replace("NAME", "rlbuf_gae_f64").replace("REAL", "double")
)

_native_lock = threading.Lock()
_native_kernels_loaded: dict[torch.dtype, Callable[..., int]] | None = None  # None: not tried yet
_native_error = ""


def _native_kernels() -> dict[torch.dtype, Callable[..., int]]:
    """Compile and load the C kernels on first call; ``{}`` (with the reason kept) on failure."""
    global _native_kernels_loaded, _native_error
    with _native_lock:
        if _native_kernels_loaded is None:
            try:
                _native_kernels_loaded = _compile_kernels()
            except (OSError, subprocess.SubprocessError, ConfigError) as error:
                _native_kernels_loaded = {}
                _native_error = str(error)
        return _native_kernels_loaded


def _compile_kernels() -> dict[torch.dtype, Callable[..., int]]:
    if os.environ.get("RLBUF_DISABLE_NATIVE", "").lower() not in ("", "0", "false", "no"):
        raise ConfigError("native GAE disabled by RLBUF_DISABLE_NATIVE")
    if sys.platform == "win32":
        raise ConfigError("native GAE is not built on Windows")
    compiler = shlex.split(os.environ.get("CC", "cc")) or ["cc"]
    if shutil.which(compiler[0]) is None:
        raise ConfigError(f"native GAE needs a C compiler; {compiler[0]!r} not found")
    # A private directory that is removed right after loading: the mapping outlives the file,
    # and no compiled code is left behind for anyone to swap.
    with tempfile.TemporaryDirectory(prefix="rlbuf-gae-") as scratch:
        source = os.path.join(scratch, "gae.c")
        library = os.path.join(scratch, "gae.so")
        with open(source, "w") as file:
            file.write(_C_SOURCE)
        # -fno-trapping-math lets the selects in the loops vectorise, results unchanged;
        # -ffp-contract=off keeps every multiply and add rounded as the torch path rounds them.
        command = [
            *compiler, "-O3", "-fno-trapping-math", "-ffp-contract=off", "-std=c99", "-shared", "-fPIC"
        ]
        try:
            subprocess.run(
                [*command, "-DRLBUF_TARGET_CLONES", "-o", library, source],
                check=True,
                capture_output=True,
                timeout=120,
            )
        except subprocess.CalledProcessError:  # a compiler or libc without target_clones
            subprocess.run(
                [*command, "-o", library, source], check=True, capture_output=True, timeout=120
            )
        lib = ctypes.CDLL(library)
    kernels = {}
    for dtype, name in ((torch.float32, "rlbuf_gae_f32"), (torch.float64, "rlbuf_gae_f64")):
        kernel = getattr(lib, name)
        kernel.restype = ctypes.c_int
        kernel.argtypes = [
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.POINTER(ctypes.c_int64),
            ctypes.c_double,
            ctypes.c_double,
        ]
        kernels[dtype] = kernel
    return kernels


def _use_native(backend: Backend, device: torch.device, numel: int) -> bool:
    if backend == "torch":
        return False
    if backend == "native":
        if device.type != "cpu":
            raise DeviceError(f"backend: 'native' runs on the CPU, got tensors on {device}")
        if not _native_kernels():
            raise ConfigError(f"backend: 'native' is unavailable: {_native_error}")
        return True
    return device.type == "cpu" and numel >= _NATIVE_MIN_NUMEL and bool(_native_kernels())


def _gae_native(
    views: _Rollout, gamma: float, gae_lambda: float, advantage: torch.Tensor, returns: torch.Tensor
) -> bool:
    """Fill ``advantage`` and ``returns`` (``[T, N]`` views) with one pass of the C kernel.

    Returns ``False`` when the kernel met a non-finite input (the outputs are then garbage).
    """
    num_steps, num_envs = views.reward.shape
    descriptors: list[int] = []
    for tensor in (views.reward, views.value, views.terminated, views.truncated):
        descriptors += (0, 0, 0) if tensor is None else (tensor.data_ptr(), *tensor.stride())
    last = views.last_value
    descriptors += (0, 0, 0) if last is None else (last.data_ptr(), 0, last.stride(0))
    for tensor in (views.bootstrap_value, views.next_value, advantage, returns):
        descriptors += (0, 0, 0) if tensor is None else (tensor.data_ptr(), *tensor.stride())
    kernel = _native_kernels()[views.reward.dtype]
    status = kernel(num_steps, num_envs, (ctypes.c_int64 * 27)(*descriptors), gamma, gae_lambda)
    if status < 0:
        raise MemoryError(f"native GAE: could not allocate {num_envs} doubles")
    return status == 0
