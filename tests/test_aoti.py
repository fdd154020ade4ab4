"""AOTInductor: a converted Keras model (Embedding with mask_zero, a masked Bidirectional LSTM, a GRU
and a softmax Dense) compiled with dynamic batch and time, its package run in a fresh process
that imports cudnn_rnn, against the eager model (the oracle: itself held to Keras by
test_example)."""
import os
import subprocess
import sys
import textwrap

import torch

import cudnn_rnn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "sentiment.h5")


def test_aoti_package_of_a_converted_model_runs_in_a_fresh_process(tmp_path):
    model = cudnn_rnn.load_keras(EXAMPLE).eval()
    tokens = torch.randint(1, 150, (4, 12))
    tokens[:, :5] = 0  # left padding: the mask is not right-aligned
    batch, time = torch.export.Dim("batch", min=1, max=512), torch.export.Dim("time", min=2, max=1024)
    with torch.no_grad():
        program = torch.export.export(model, (tokens,), dynamic_shapes=(({0: batch, 1: time},),))
        package = torch._inductor.aoti_compile_and_package(program, package_path=str(tmp_path / "model.pt2"))
    script = textwrap.dedent(f"""
        import torch, cudnn_rnn  # cudnn_rnn registers the ops the package calls
        torch.manual_seed(0)
        run = torch._inductor.aoti_load_package({package!r})
        model = cudnn_rnn.load_keras({EXAMPLE!r}).eval()
        worst = 0.0
        for b, t in ((4, 12), (1, 3), (9, 30)):
            tokens = torch.randint(1, 150, (b, t))
            tokens[: b // 2, : t // 2] = 0
            with torch.no_grad():
                worst = max(worst, (run(tokens) - model(tokens)).abs().max().item())
        print("worst", worst)
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    worst = float(out.stdout.split("worst")[-1])
    assert worst < 1e-5, out.stdout
