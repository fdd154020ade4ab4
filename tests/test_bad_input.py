"""Bad hyperparameters raise ValueError at construction; bad inputs raise one error naming the
argument with the expected and the actual shape / dtype / device (from the layer and from the op)."""
import os

import pytest
import torch

import cudnn_rnn
from cudnn_rnn import ops


@pytest.mark.parametrize("kwargs,match", [
    (dict(units=0), "units must be a positive integer; got 0"),
    (dict(units=2.5), "units must be a positive integer; got 2.5"),
    (dict(input_size=-1), "input_size must be a positive integer; got -1"),
    (dict(num_layers=0), "num_layers must be a positive integer; got 0"),
    (dict(activation="swishy"), "activation 'swishy' is not one the recurrent cells compute; it must be one of "),
    (dict(recurrent_activation="softmax"), "recurrent_activation 'softmax' is not one the recurrent cells compute"),
    (dict(dropout=1.5), r"dropout must be a float in \[0, 1\]; got 1.5"),
    (dict(recurrent_dropout=-0.1), r"recurrent_dropout must be a float in \[0, 1\]; got -0.1"),
    (dict(kernel_initializer="magic"), "kernel_initializer must be one of"),
])
def test_bad_hyperparameters(kwargs, match):
    args = dict(input_size=3, units=4)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        cudnn_rnn.LSTM(**args)


def test_bad_bidirectional_arguments():
    with pytest.raises(ValueError, match="merge_mode must be one of"):
        cudnn_rnn.Bidirectional(cudnn_rnn.GRU(3, 4), merge_mode="max")
    with pytest.raises(ValueError, match="layer must be a cudnn_rnn LSTM, GRU or SimpleRNN; got Linear"):
        cudnn_rnn.Bidirectional(torch.nn.Linear(3, 4))
    with pytest.raises(ValueError, match="different go_backwards"):
        cudnn_rnn.Bidirectional(cudnn_rnn.GRU(3, 4), backward_layer=cudnn_rnn.GRU(3, 4))
    with pytest.raises(ValueError, match="same return_sequences"):
        cudnn_rnn.Bidirectional(cudnn_rnn.GRU(3, 4), backward_layer=cudnn_rnn.GRU(3, 4, go_backwards=True, return_sequences=True))
    with pytest.raises(ValueError, match="num_layers > 1 in a Bidirectional"):
        cudnn_rnn.Bidirectional(cudnn_rnn.GRU(3, 4, num_layers=2),
                                backward_layer=cudnn_rnn.GRU(3, 5, num_layers=2, go_backwards=True))


@pytest.fixture
def lstm():
    return cudnn_rnn.LSTM(3, 4, return_sequences=True).eval()


def test_bad_x(lstm):
    with pytest.raises(ValueError, match=r"x must have shape \(batch, time, 3\); got \(2, 5\)"):
        lstm(torch.randn(2, 5))
    with pytest.raises(ValueError, match=r"x must have shape \(batch, time, 3\); got \(2, 5, 4\)"):
        lstm(torch.randn(2, 5, 4))
    with pytest.raises(ValueError, match="x must have at least one timestep"):
        lstm(torch.randn(2, 0, 3))
    with pytest.raises(TypeError, match="x must have dtype torch.float32 .* got torch.float64"):
        lstm(torch.randn(2, 5, 3, dtype=torch.float64))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        lstm([[1.0, 2.0, 3.0]])
    with pytest.raises(ValueError, match="x must be on cpu .* got meta"):
        lstm(torch.randn(2, 5, 3, device="meta"))


def test_bad_mask_and_state(lstm):
    x = torch.randn(2, 5, 3)
    with pytest.raises(ValueError, match=r"mask must have shape \(batch, time\) = \(2, 5\); got \(2, 4\)"):
        lstm(x, mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"initial_state must be a list of 2 tensors of shape \(batch, 4\); got 1"):
        lstm(x, initial_state=[torch.zeros(2, 4)])
    with pytest.raises(ValueError, match=r"initial_state\[1\] must have shape \(2, 4\); got \(2, 3\)"):
        lstm(x, initial_state=[torch.zeros(2, 4), torch.zeros(2, 3)])
    with pytest.raises(TypeError, match=r"initial_state\[0\] must be torch.float32 on cpu; got torch.float64"):
        lstm(x, initial_state=[torch.zeros(2, 4, dtype=torch.float64), torch.zeros(2, 4)])
    # a non-bool mask is read as "non-zero = real step", like Keras
    torch.testing.assert_close(lstm(x, mask=torch.tensor([[1, 1, 0, 0, 1]] * 2)),
                               lstm(x, mask=torch.tensor([[True, True, False, False, True]] * 2)))


def test_stateful_batch_change():
    layer = cudnn_rnn.GRU(3, 4, stateful=True)
    layer(torch.randn(2, 5, 3))
    with pytest.raises(ValueError, match="x has batch size 3 but the kept states have batch size 2"):
        layer(torch.randn(3, 5, 3))
    layer.reset_states()
    assert layer(torch.randn(3, 5, 3)).shape == (3, 4)


def _op(x, weights, **over):
    args = dict(mask=None, h0=None, c0=None, dropout_masks=[], recurrent_dropout_masks=[])
    config = dict(cell="lstm", activation="tanh", recurrent_activation="sigmoid", use_bias=True, reset_after=False,
                  num_layers=1, bidirectional=False, go_backwards=False, zero_output_for_mask=False)
    for k, v in over.items():
        (args if k in args else config)[k] = v
    return ops.rnn_forward(x, weights, args["mask"], args["h0"], args["c0"], args["dropout_masks"],
                           args["recurrent_dropout_masks"], **config)


def test_op_errors_name_the_argument():
    x = torch.randn(2, 5, 3)
    w = [torch.randn(3, 16), torch.randn(4, 16), torch.randn(16)]
    with pytest.raises(ValueError, match=r"weights\[layer 0, direction 0\].kernel must have shape \[3, 16\]; got \[4, 16\]"):
        _op(x, [torch.randn(4, 16)] + w[1:])
    with pytest.raises(ValueError, match=r"weights\[layer 0, direction 0\].bias must have shape \[16\]; got \[12\]"):
        _op(x, w[:2] + [torch.randn(12)])
    with pytest.raises(TypeError, match=r"weights\[layer 0, direction 0\].recurrent_kernel must have dtype Float .* got Double"):
        _op(x, [w[0], w[1].double(), w[2]])
    with pytest.raises(ValueError, match="weights must hold 6 tensors .* got 3"):
        _op(x, w, bidirectional=True)
    with pytest.raises(ValueError, match=r"mask must have shape \[2, 5\]; got \[5, 2\]"):
        _op(x, w, mask=torch.ones(5, 2, dtype=torch.bool))
    with pytest.raises(TypeError, match="mask must be a bool tensor; got Float"):
        _op(x, w, mask=torch.ones(2, 5))
    with pytest.raises(ValueError, match=r"h0 must have shape \[1, 2, 4\]; got \[2, 4\]"):
        _op(x, w, h0=torch.zeros(2, 4))
    with pytest.raises(ValueError, match="c0 is only accepted by the LSTM cell"):
        _op(x, [w[0][:, :12], w[1][:, :12], w[2][:12]], cell="gru", c0=torch.zeros(1, 2, 4))
    with pytest.raises(ValueError, match=r"dropout_masks\[layer 0, direction 0\] must have shape \(1 or 4, 2, 3\); got \[2, 2, 3\]"):
        _op(x, w, dropout_masks=[torch.ones(2, 2, 3)])
    with pytest.raises(ValueError, match="activation must be one of .* got 'swish'"):
        _op(x, w, activation="swish")
    with pytest.raises(ValueError, match="cell must be 'lstm', 'gru' or 'simple_rnn'; got 'rnn'"):
        _op(x, w, cell="rnn")
    with pytest.raises(TypeError, match="x must be float32, float64, float16 or bfloat16; got Long"):
        _op(torch.ones(2, 5, 3, dtype=torch.long), w)


def test_explain():
    assert cudnn_rnn.explain(cudnn_rnn.LSTM(3, 4)).backend == "cpu"
    assert cudnn_rnn.explain(cudnn_rnn.LSTM(3, 4), "cuda").backend == "cudnn"
    # The default algorithm ("auto"): LSTM's persistent small-hidden kernel, STANDARD for the others.
    assert "algorithm PERSIST_STATIC_SMALL_H" in str(cudnn_rnn.explain(cudnn_rnn.LSTM(3, 4), "cuda"))
    assert "algorithm STANDARD" in str(cudnn_rnn.explain(cudnn_rnn.GRU(3, 4), "cuda"))
    e = cudnn_rnn.explain(cudnn_rnn.LSTM(3, 4, recurrent_activation="hard_sigmoid"), "cuda")
    assert e.backend == "cuda-generic"
    assert "recurrent_activation='hard_sigmoid' is not supported by cuDNN" in str(e)
    e = cudnn_rnn.explain(cudnn_rnn.Bidirectional(cudnn_rnn.GRU(3, 4, reset_after=False)), "cuda")
    assert e.backend == "cuda-generic" and "reset_after=False" in str(e)
    e = cudnn_rnn.explain(cudnn_rnn.GRU(3, 4, recurrent_dropout=0.2), "cuda", training=True)
    assert e.backend == "cuda-generic" and "recurrent_dropout masks h inside the step" in str(e)
    assert cudnn_rnn.explain(cudnn_rnn.GRU(3, 4, recurrent_dropout=0.2), "cuda", training=False).backend == "cudnn"
    assert cudnn_rnn.explain(cudnn_rnn.SimpleRNN(3, 4, activation="relu"), "cuda").backend == "cudnn"
    assert cudnn_rnn.explain(cudnn_rnn.SimpleRNN(3, 4, activation="elu"), "cuda").backend == "cuda-generic"


def test_explain_with_the_calls_mask():
    """explain(..., mask=) answers for that call: right-padded (or all-true) masks stay on cuDNN,
    left padding and holes run cuda-generic and say so; the generic mask note is then dropped."""
    lstm = cudnn_rnn.Bidirectional(cudnn_rnn.LSTM(3, 4, return_sequences=True))
    right = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    left = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]], dtype=torch.bool)
    holes = torch.tensor([[1, 0, 1, 1], [1, 1, 1, 1]])
    e = cudnn_rnn.explain(lstm, "cuda", mask=right)
    assert e.backend == "cudnn" and not e.notes, e
    for mask in (left, holes):
        e = cudnn_rnn.explain(lstm, "cuda", mask=mask)
        assert e.backend == "cuda-generic" and "the mask is not right-padded" in str(e), e
    assert cudnn_rnn.explain(lstm, "cpu", mask=left).backend == "cpu"
    with pytest.raises(ValueError, match=r"mask must be a \(batch, time\) tensor"):
        cudnn_rnn.explain(lstm, "cuda", mask=torch.ones(3, dtype=torch.bool))
    # The call's input given where the device goes (explain's second argument): named.
    with pytest.raises(TypeError, match=r"device must be a str or torch.device; got Tensor"):
        cudnn_rnn.explain(lstm, torch.ones(2, 4, 3))
    with pytest.raises(ValueError, match=r"device must name a device .* got 'gpu'"):
        cudnn_rnn.explain(lstm, "gpu")


def test_empty_batch():
    layer = cudnn_rnn.GRU(3, 4, return_sequences=True, return_state=True)
    y, h = layer(torch.randn(0, 5, 3))
    assert y.shape == (0, 5, 4) and h.shape == (0, 4)


def test_build_info_reports_the_build():
    info = cudnn_rnn.build_info()
    assert set(info) >= {"cuda", "cudnn"}
    if torch.version.cuda is not None and os.environ.get("FORCE_CUDA") == "1":
        # CI builds with FORCE_CUDA=1: a CPU-only build must not pass for a CUDA one.
        assert info["cudnn"] != "no", f"the extension was built without CUDA/cuDNN: {info}"
