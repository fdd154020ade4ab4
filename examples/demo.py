"""The main job on a small model: Keras-style recurrent layers as a PyTorch model.

A text-classifier-like stack (Bidirectional LSTM -> GRU with reset_after=False and
hard_sigmoid gates, as Keras 2 models often had) runs on left-padded sequences with a mask. The
script prints which backend ran each recurrent layer (and what would run on a GPU, and why),
the output shapes, and checks the bidirectional LSTM against torch.nn.LSTM on the same weights.
"""
import torch
from torch import nn

import cudnn_rnn


class Classifier(nn.Module):
    def __init__(self, features=16, classes=3):
        super().__init__()
        self.encoder = cudnn_rnn.Bidirectional(cudnn_rnn.LSTM(features, 32, return_sequences=True))
        self.summary = cudnn_rnn.GRU(64, 24, reset_after=False, recurrent_activation="hard_sigmoid",
                                     return_state=True)
        self.head = nn.Linear(24, classes)

    def forward(self, x, mask):
        seq = self.encoder(x, mask=mask)
        last, state = self.summary(seq, mask=mask)
        return self.head(last), seq, state


def main():
    torch.manual_seed(0)
    batch, time, features = 4, 12, 16
    x = torch.randn(batch, time, features)
    lengths = torch.tensor([12, 9, 5, 1])
    mask = torch.arange(time)[None, :] >= (time - lengths)[:, None]  # left-padded, as Keras pads by default
    model = Classifier(features).eval()

    with torch.no_grad():
        logits, seq, state = model(x, mask)
    print(f"cudnn_rnn {cudnn_rnn.__version__}, build: {cudnn_rnn.build_info()}")
    for name, layer in (("encoder", model.encoder), ("summary", model.summary)):
        print(f"{name:8s} ran on: {cudnn_rnn.explain(layer, x.device)}")
        print(f"{'':8s} on a GPU: {cudnn_rnn.explain(layer, 'cuda')}")
    print(f"encoder output {tuple(seq.shape)}, summary state {tuple(state.shape)}, logits {tuple(logits.shape)}")

    # The bidirectional LSTM is also a torch.nn.LSTM: same weights, same numbers (no mask there).
    reference = model.encoder.to_torch().eval()
    with torch.no_grad():
        ours = model.encoder(x)
        theirs, _ = reference(x)
    error = (ours - theirs).abs().max().item()
    print(f"max |ours - torch.nn.LSTM| on unmasked input: {error:.2e}")
    if error > 1e-5:
        raise SystemExit("mismatch against torch.nn.LSTM")


if __name__ == "__main__":
    main()
