"""The README's main job runs and says what it checked."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_demo_runs():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "demo.py")], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "encoder  ran on: cpu on cpu" in out.stdout
    assert "recurrent_activation='hard_sigmoid' is not supported by cuDNN" in out.stdout
    assert "logits (4, 3)" in out.stdout


def test_convert_keras_example_runs():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "convert_keras.py")], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "max |ours - Keras| = " in out.stdout and "identical = True" in out.stdout
    # the shipped data is left-padded: what really runs on a GPU for it, not "cudnn"
    assert ("bidirectional  backend cpu on cpu; on a GPU with this data: cuda-generic on cuda: the mask is not "
            "right-padded") in out.stdout, out.stdout
    assert "gru            backend cpu on cpu; on a GPU with this data: cuda-generic" in out.stdout
