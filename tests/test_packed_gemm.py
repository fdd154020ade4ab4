"""The packed float32 GEMM (csrc/cpu/packed_gemm.cpp), each build this CPU runs, held to torch.mm
in float64 over shapes that reach every tile: row tiles of 1 to 6 rows (the single-row tiles
split k), AVX-512 groups of 1 to 4 panels, a partial last panel, K blocks of 512, rows picked
through an index list, a bias, and accumulation into C."""
import pytest
import torch

from cudnn_rnn import _C

needs_packed = pytest.mark.skipif(not _C._testing.cpu_packed_gemm(), reason="the packed GEMM needs AVX2 + FMA")
pytestmark = needs_packed


from isa_builds import packed_build  # noqa: F401,E402  (the `build` fixture)


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


needs_avx512 = pytest.mark.skipif(not _C._testing.cpu_packed_gemm_avx512(), reason="no AVX-512 F/BW/DQ/VL on this CPU")


@pytest.fixture
def packed_engine(build):
    _C._testing.override_cpu_gemm_engine("packed")
    yield build
    _C._testing.override_cpu_gemm_engine("")


FLOOR = 2 ** 20  # csrc/cpu/time_loop.h: kPackedWeightGradFloor


@pytest.mark.parametrize("R,k,N", [(0, 3, 5), (1, 1, 1), (7, 5, 3), (513, 37, 130), (1100, 17, 199),
                                   (20000, 33, 450), (16384, 130, 257), (50, 256, 512), (30, 300, 770)])
def test_weight_grad_matches_float64(packed_engine, R, k, N):
    """The backward's weight-gradient GEMM A^T D on each build (csrc/cpu/plan_packed.cpp
    packed_weight_grad: A packed, D's blocks copied into row tiles of 6 with the rows past N zero,
    K blocks of 512, the threads splitting D's columns, the product transposed; with few rows R,
    D packed and A read as the transposed operand, the threads splitting the product's rows)
    against float64; error at most 3x torch.mm's in float32, both against float64. Below its
    size floor it declines (None)."""
    g = torch.Generator().manual_seed(R + k + N)
    A = torch.randn(R, k, generator=g)
    D = torch.randn(R, N + 7, generator=g)[:, :N]  # rows N + 7 apart, as a gate block's are
    got = _C._testing.packed_weight_grad([(A, None)], D)
    if R * k * N < FLOOR:
        assert got is None
        return
    assert got is not None and got.shape == (k, N) and got.is_contiguous()
    want = A.double().t() @ D.double()
    # Sums of up to 20000 products: held to ATen's own float32 GEMM's error on the same product.
    err, err_mm = (got.double() - want).abs().max(), ((A.t() @ D).double() - want).abs().max()
    assert err <= 3 * err_mm + 1e-6, (err, err_mm)


@pytest.mark.parametrize("R,widths,N", [(6400, (64, 64), 256), (1100, (17, 33), 199), (3000, (513, 1), 20),
                                        (400, (16, 5, 40), 96), (50, (100, 61), 333), (8, (512, 512), 2048)])
@pytest.mark.parametrize("ones", [False, True])
def test_stacked_weight_grads_match_float64(packed_engine, R, widths, N, ones):
    """Several parts in one product, [x | h_prev (| 1)]^T D as the backward stacks the kernel's and
    the recurrent kernel's gradients (and the bias's): the first part's rows in order, the others'
    picked through row lists (h_prev re-indexed to the input's order as it is packed), widths that
    leave a part's last panel partial; held to float64 like the single product."""
    g = torch.Generator().manual_seed(R + N + len(widths))
    parts, full = [], []
    for i, w in enumerate(widths):
        A = torch.randn(R + 9 * i, w, generator=g)
        rows = None if i == 0 else torch.randperm(R + 9 * i, generator=g)[:R]
        parts.append((A, rows))
        full.append(A if rows is None else A[rows])
    if ones:
        full.append(torch.ones(R, 1))
    D = torch.randn(R, N + 3, generator=g)[:, :N]
    got = _C._testing.packed_weight_grad(parts, D, ones)
    assert got is not None and got.shape == (sum(widths) + ones, N)
    stacked = torch.cat(full, 1)
    want = stacked.double().t() @ D.double()
    err, err_mm = (got.double() - want).abs().max(), ((stacked.t() @ D).double() - want).abs().max()
    assert err <= 3 * err_mm + 1e-6, (err, err_mm)


def test_weight_grad_declines_where_blas_serves():
    """With BLAS as the engine (the Intel default for large GEMMs) the weight gradients stay on it."""
    _C._testing.override_cpu_gemm_engine("blas")
    try:
        assert _C._testing.packed_weight_grad([(torch.randn(20000, 130), None)], torch.randn(20000, 257)) is None
    finally:
        _C._testing.override_cpu_gemm_engine("")
