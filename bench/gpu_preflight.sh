# Sourced by bench/gpu_run.sh (`. bench/gpu_preflight.sh >"$OUT/preflight.txt"`), before the GPU check:
# what Triton needs to build its launcher on the lent machine (issue 30), then every Triton kernel the
# check and the cuda tests launch compiled ahead into the cache, in parallel (bench/gpu_warm.py; its
# lines in $OUT/triton_warm.log). Without Triton's launcher, the paged-attention check fails and decode
# loses its Triton kernel. Each check prints one line, `preflight: NAME ok (what) | FAILED (why)`; none
# stops the run (gpu_check records the lines in `environment.preflight`). Sourced, so what it exports
# (TRITON_CACHE_DIR, and CC when only `cc` exists) holds for the rest of the run. Needs $PY (the
# interpreter). At most 10 + 20 + 10 + 45 + $PREFLIGHT_WARM_S (75) = 160 s, each check capped; about
# 50 s when all goes well (the warm-up's float32 compiles, 13 s each, two to a process, are most of it).

_pf() { echo "preflight: $1 $2"; }

# Triton's C compiler: $CC, else gcc, else clang (triton/runtime/build.py); a bare `cc` is exported as CC.
_pf_cc=${CC:-$(command -v gcc || command -v clang || true)}
if [ -z "$_pf_cc" ] && command -v cc >/dev/null; then
  _pf_cc=$(command -v cc); export CC=$_pf_cc
fi
if [ -z "$_pf_cc" ]; then
  _pf compiler "FAILED (no \$CC, gcc, clang or cc on PATH)"
else
  _pf_src=$(mktemp /tmp/pdtop-preflight-XXXXXX.c)
  echo 'int main(void) { return 0; }' >"$_pf_src"
  if _pf_err=$(timeout 10 "$_pf_cc" "$_pf_src" -o "$_pf_src.out" 2>&1); then
    _pf compiler "ok ($_pf_cc${CC:+, CC=$CC})"
  else
    _pf compiler "FAILED ($_pf_cc cannot build a C file: $(echo "$_pf_err" | tail -n 1))"
  fi
  rm -f "$_pf_src" "$_pf_src.out"
fi

# Python.h where Triton looks for it (sysconfig's include dir)
if _pf_inc=$(timeout 20 "$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>&1); then
  if [ -f "$_pf_inc/Python.h" ]; then _pf python_h "ok ($_pf_inc/Python.h)"
  else _pf python_h "FAILED (no Python.h in $_pf_inc: the python3-dev headers are missing)"; fi
else
  _pf python_h "FAILED ($PY did not run: $(echo "$_pf_inc" | tail -n 1))"
fi

# libcuda as Triton finds it: `ldconfig -p` lists libcuda.so.1 (else TRITON_LIBCUDA_PATH)
_pf_ldc=$(command -v ldconfig || echo /sbin/ldconfig)
_pf_lib=$(timeout 10 "$_pf_ldc" -p 2>/dev/null | grep -m 1 'libcuda\.so\.1 ' | awk '{print $NF}')
if [ -n "$_pf_lib" ]; then
  _pf libcuda "ok ($_pf_lib)"
elif [ -n "${TRITON_LIBCUDA_PATH:-}" ]; then
  _pf libcuda "ok (not in ldconfig -p; TRITON_LIBCUDA_PATH=$TRITON_LIBCUDA_PATH)"
else
  _pf libcuda "FAILED (ldconfig -p lists no libcuda.so.1: no NVIDIA driver, or set TRITON_LIBCUDA_PATH)"
fi

# a writable Triton cache on /tmp (the home directory may be read-only or shared)
export TRITON_CACHE_DIR=/tmp/pdtop-triton-cache
if mkdir -p "$TRITON_CACHE_DIR" 2>/dev/null && [ -w "$TRITON_CACHE_DIR" ]; then
  _pf triton_cache_dir "ok ($TRITON_CACHE_DIR)"
else
  _pf triton_cache_dir "FAILED ($TRITON_CACHE_DIR is not writable)"
fi

# one Triton kernel compiled and run (from a file: @triton.jit reads its function's source)
_pf_py=$(mktemp /tmp/pdtop-preflight-XXXXXX.py)
cat >"$_pf_py" <<'EOF'
import torch
import triton
import triton.language as tl


@triton.jit
def add_one(x, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x + i, tl.load(x + i, mask=i < n) + 1, mask=i < n)


x = torch.zeros(1000, device="cuda")
add_one[(triton.cdiv(1000, 256),)](x, 1000, BLOCK=256)
assert x.sum().item() == 1000, "wrong result"
print(f"triton {triton.__version__}")
EOF
_pf_err=$(timeout -k 5 45 "$PY" "$_pf_py" 2>&1); _pf_rc=$?
_pf_kernel=$_pf_rc
if [ "$_pf_rc" = 0 ]; then
  _pf triton_kernel "ok ($(echo "$_pf_err" | tail -n 1))"
elif [ "$_pf_rc" = 124 ] || [ "$_pf_rc" = 137 ]; then
  _pf triton_kernel "FAILED (did not finish in 45 s)"
else
  _pf triton_kernel "FAILED ($(echo "$_pf_err" | grep -v '^[[:space:]]*$' | tail -n 1 | cut -c1-240))"
fi
rm -f "$_pf_py"

# the check's and the tests' Triton kernels compiled ahead, in parallel, into TRITON_CACHE_DIR
_pf_warm_s=${PREFLIGHT_WARM_S:-75}
if [ "$_pf_kernel" != 0 ]; then
  _pf triton_warm "FAILED (not tried: no Triton kernel runs here; the check records what decode runs instead)"
else
  _pf_err=$(timeout -k 5 "$_pf_warm_s" "$PY" bench/gpu_warm.py 2>&1); _pf_rc=$?
  printf '%s\n' "$_pf_err" >"${OUT:-/tmp}/triton_warm.log"
  if [ "$_pf_rc" = 0 ]; then
    _pf triton_warm "ok ($(echo "$_pf_err" | tail -n 1 | sed 's/^warm: //'))"
  elif [ "$_pf_rc" = 124 ] || [ "$_pf_rc" = 137 ]; then
    _pf triton_warm "FAILED (did not finish in $_pf_warm_s s: $(grep -c ': ok (' <<<"$_pf_err") variants compiled)"
  else
    _pf triton_warm "FAILED ($( { grep -m 1 -v ': ok (' <<<"$_pf_err" || echo "exit $_pf_rc"; } | cut -c1-240))"
  fi
fi
unset -f _pf
unset _pf_cc _pf_src _pf_err _pf_inc _pf_ldc _pf_lib _pf_py _pf_rc _pf_kernel _pf_warm_s
