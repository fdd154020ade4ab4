"""A test run once per instruction-set build of a CPU kernel: each build this CPU runs forced for
the test (the machine's choice restored after it), the others skipped naming what the CPU lacks."""
import pytest

from cudnn_rnn import _C


def build_fixture(builds, override):
    """A `build` fixture over builds [(name, whether this CPU runs it, what it needs)], forced
    through override (one of _C._testing's override_*_isa)."""
    params = [pytest.param(name, marks=pytest.mark.skipif(not runs, reason=f"no {needs} on this CPU"))
              for name, runs, needs in builds]

    @pytest.fixture(params=params, name="build")
    def build(request):
        override(request.param)
        yield request.param
        override("")

    return build


_AVX2 = ("avx2", _C._testing.cpu_packed_gemm(), "AVX2 + FMA")
# The packed float32 GEMM's builds, which conv_weight_grad follows too.
packed_build = build_fixture([_AVX2, ("avx512", _C._testing.cpu_packed_gemm_avx512(), "AVX-512 F/BW/DQ/VL")],
                             _C._testing.override_packed_gemm_isa)
# The int8 GEMM's builds.
int8_build = build_fixture([_AVX2, ("avx_vnni", _C._testing.cpu_int8_gemm_avx_vnni(), "AVX_VNNI"),
                            ("avx512_vnni", _C._testing.cpu_int8_gemm_avx512(), "AVX512_VNNI")],
                           _C._testing.override_int8_gemm_isa)
