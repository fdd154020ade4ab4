"""The packed float32 GEMM (csrc/cpu/packed_gemm.cpp), each build this CPU runs, held to torch.mm
in float64 over shapes that reach every tile: row tiles of 1 to 6 rows (the single-row tiles
split k), AVX-512 groups of 1 to 4 panels, a partial last panel, K blocks of 512, rows picked
through an index list, a bias, and accumulation into C."""
import pytest
import torch

from cudnn_rnn import _C

pytestmark = pytest.mark.skipif(not _C._testing.cpu_packed_gemm(), reason="the packed GEMM needs AVX2 + FMA")


BUILDS = ["avx2", pytest.param("avx512", marks=pytest.mark.skipif(not _C._testing.cpu_packed_gemm_avx512(),
                                                             reason="no AVX-512 F/BW/DQ/VL on this CPU"))]


@pytest.fixture(params=BUILDS)
def build(request):
    _C._testing.override_packed_gemm_isa(request.param)
    yield request.param
    _C._testing.override_packed_gemm_isa("")


@pytest.mark.parametrize("M", [1, 2, 5, 6, 7, 13, 64])
@pytest.mark.parametrize("N", [1, 15, 16, 17, 48, 64, 65, 100, 130])
@pytest.mark.parametrize("K", [1, 3, 200, 513])
def test_product_matches_float64(build, M, N, K):
    assert _C.cpu_packed_gemm_isa() == build
    g = torch.Generator().manual_seed(M * 10007 + N * 101 + K)
    A = torch.randn(M, K, generator=g)
    B = torch.randn(K, N, generator=g)
    got = _C._testing.packed_gemm(A, B)
    torch.testing.assert_close(got.double(), A.double() @ B.double(), rtol=1e-5, atol=1e-4 * K ** 0.5)


@pytest.mark.parametrize("trans_b", [False, True])
def test_rows_bias_and_accumulation(build, trans_b):
    """Rows picked by index (the masked steps' active rows, read and written in place): the other
    rows of C stay as they were; without C the bias starts each picked row, with C its values."""
    g = torch.Generator().manual_seed(5)
    R, K, N = 23, 70, 83
    A = torch.randn(R, K, generator=g)
    B = torch.randn(N, K, generator=g) if trans_b else torch.randn(K, N, generator=g)
    Bm = (B.t() if trans_b else B).double()
    rows = torch.tensor([0, 3, 4, 9, 10, 11, 12, 17, 22])
    bias = torch.randn(N, generator=g)
    got = _C._testing.packed_gemm(A, B, trans_b=trans_b, bias=bias, rows=rows)
    want = torch.zeros(R, N, dtype=torch.float64)
    want[rows] = A[rows].double() @ Bm + bias.double()
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)
    C = torch.randn(R, N, generator=g)
    got = _C._testing.packed_gemm(A, B, trans_b=trans_b, bias=bias, C=C, rows=rows)
    want = C.double().clone()
    want[rows] += A[rows].double() @ Bm
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)


def test_build_override_is_checked():
    with pytest.raises(ValueError, match="'avx2' or 'avx512'; got 'sse'"):
        _C._testing.override_packed_gemm_isa("sse")
