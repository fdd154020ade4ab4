"""Writes docs/keras-layers.md: every layer class in keras.layers (the Keras installed here) with
what load_keras does with it: converted (and by which file of cudnn_rnn/keras/layers/), converted
inside RNN / Bidirectional, or refused and why; then every operation class of keras.ops (what a
functional graph records for a keras.ops call) and whether it converts, and the TensorFlow
functions whose tf.keras 2 recordings convert.
tests/test_keras_layer_table.py fails when Keras has a class the table does not place, or when
the committed page differs from what this writes.

    bash scripts/env.sh python scripts/keras_layer_table.py
"""
from __future__ import annotations

import inspect
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "torch")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "keras-layers.md")


def keras_layer_classes() -> dict:
    """{class name as a config names it: the names keras.layers exports it under}."""
    import keras

    classes: dict = {}
    for name, cls in vars(keras.layers).items():
        if inspect.isclass(cls) and issubclass(cls, keras.layers.Layer):
            classes.setdefault(cls, []).append(name)
    return {min(names, key=lambda n: (n != cls.__name__, len(n))): sorted(names) for cls, names in classes.items()}


def rows() -> list:
    """(class, exported names, status, where or why) for every keras.layers class; status None
    when nothing places it."""
    from cudnn_rnn.keras.layers.registry import BUILDERS, INSIDE_RNN, REFUSED

    out = []
    for name, names in sorted(keras_layer_classes().items()):
        known = [n for n in names if n in BUILDERS]
        if known:
            module = BUILDERS[known[0]].__module__.rsplit(".", 1)[-1]
            out.append((name, names, "converted", f"`layers/{module}.py`"))
        elif name in INSIDE_RNN:
            out.append((name, names, "converted inside RNN / Bidirectional", "`layers/recurrent.py`"))
        elif name in REFUSED:
            out.append((name, names, "refused", REFUSED[name]))
        else:
            out.append((name, names, None, ""))
    return out


# keras.ops classes refused for a reason of their own (the others: not converted yet)
_OPS_REFUSED = {
    **{n: "it calls Python functions, which a file does not hold" for n in (
        "AssociativeScan", "Cond", "ForiLoop", "JVP", "Map", "Scan", "Switch", "VectorizedMap", "WhileLoop")},
    **{n: "its result is complex (a graph here carries real tensors)" for n in (
        "Eig", "FFT", "FFT2", "IFFT2", "IRFFT", "ISTFT", "Polar", "RFFT", "STFT", "ViewAsComplex", "ViewAsReal")},
    **{n: "its output's shape depends on the values" for n in ("Nonzero", "Unique")},
    **{n: "it draws random numbers" for n in ("ElasticTransform",)},
    "ConvTranspose": "Keras 3.15 cannot run it (its call fails on every backend)",
    "Arange": "Keras cannot record it on a Keras tensor (its shape needs the values)",
    "ScaleAndTranslate": "Keras cannot save it (its spatial_dims are not serializable)",
    "SegmentReduction": "the base class of the segment reductions (SegmentSum, SegmentMax, ...)",
}
_OPS_MODULES = ("numpy", "core", "nn", "math", "linalg", "image")


def operation_rows() -> list:
    """(class, keras.ops module, status, where or why) for every operation class of keras.ops."""
    import importlib

    from keras.src.ops.operation import Operation

    from cudnn_rnn.keras.layers.ops import OP_FILES

    out = []
    for module in _OPS_MODULES:
        mod = importlib.import_module(f"keras.src.ops.{module}")
        for name, cls in sorted(vars(mod).items()):
            if not (inspect.isclass(cls) and issubclass(cls, Operation) and cls.__module__ == mod.__name__):
                continue
            if name in OP_FILES:
                out.append((name, module, "converted", f"`layers/{OP_FILES[name]}.py`"))
            else:
                out.append((name, module, "refused", _OPS_REFUSED.get(name, "not converted yet")))
    return out


def page() -> str:
    import keras

    table = rows()
    converted = sum(1 for r in table if r[2] and r[2].startswith("converted"))
    lines = [
        "# Keras layer classes",
        "",
        f"Every layer class of `keras.layers` in Keras {keras.__version__} and what `cudnn_rnn.load_keras` does "
        f"with it: {converted} of {len(table)} are converted. A refused class stops the load with one error that "
        "names it, where it is in the model, and the reason below; a model's own classes (and these) can be given "
        "builders with `load_keras(..., custom_layers={...})`.",
        "",
        "Written by `scripts/keras_layer_table.py`; `tests/test_keras_layer_table.py` keeps it true.",
        "",
        "| class | also exported as | status | where / why |",
        "|---|---|---|---|",
    ]
    for name, names, status, note in table:
        others = ", ".join(n for n in names if n != name)
        lines.append(f"| `{name}` | {others} | {status or 'NOT PLACED'} | {note} |")
    lines += [
        "",
        "## Beyond keras.layers",
        "",
        "The layer classes `keras.applications` defines for its models (and tf.keras 2's) convert too "
        "(`layers/applications.py`): ConvNeXt's `LayerScale` and `StochasticDepth`, InceptionResNetV2's "
        "`CustomScaleLayer`. With them every architecture of `keras.applications` converts: VGG, ResNet (v1, v2, "
        "tf.keras's ResNet-RS), DenseNet, Inception v3, Inception-ResNet v2, Xception, MobileNet v1-v3, NASNet, "
        "EfficientNet (v1, v2), ConvNeXt and tf.keras's RegNet. A class of one of those names from another module "
        "is the model's own, and needs a builder.",
        "",
        "Models built on `keras.utils.FeatureSpace` convert whole (`layers/preprocessing.py`): besides the stock "
        "preprocessing layers (Normalization, Rescaling, Discretization, StringLookup / IntegerLookup, Hashing, "
        "HashedCrossing, CategoryEncoding) their graphs hold two classes of Keras 3's own, `TFDConcat` "
        "(`output_mode=\"concat\"`) and `TFDIdentity` (`FeatureSpace.float()`), recorded under FeatureSpace's "
        "module; as with the applications' classes, one of those names from another module is the model's own. "
        "(tf.keras 2's FeatureSpace uses `Concatenate`.)",
    ]
    ops = operation_rows()
    lines += [
        "",
        "## Operations",
        "",
        f"A functional model records each `keras.ops` call (and each Python operator on a Keras tensor: `x + y`, "
        f"`x[:, -1]`) as an operation class. Of the {len(ops)} classes of `keras.ops` in Keras {keras.__version__}, "
        f"{sum(1 for r in ops if r[2] == 'converted')} convert, with their keyword arguments, constant arrays and "
        "several outputs; a refused one stops the load naming it.",
        "",
        "| operation | keras.ops module | status | where / why |",
        "|---|---|---|---|",
    ]
    lines += [f"| `{name}` | {module} | {status} | {note} |" for name, module, status, note in ops]
    from cudnn_rnn.keras.layers.ops_tf import RAW_OPS, TF_FUNCTIONS

    lines += [
        "",
        "## tf.keras 2's TensorFlow calls",
        "",
        "tf.keras 2 records a TensorFlow function called on Keras tensors as a `TFOpLambda` (or `SlicingOpLambda`) "
        f"layer holding the function's name and arguments. These {len(TF_FUNCTIONS)} names convert, with "
        "TensorFlow's semantics (`layers/ops_tf.py`); any other is refused by name:",
        "",
        ", ".join(f"`tf.{name}`" for name in sorted(TF_FUNCTIONS)) + ".",
        "",
        "tf.keras 2.0-2.3 recorded the same calls as a `TensorFlowOpLayer`: the raw graph node (its op, inputs and "
        f"attributes) and its constant inputs. These {len(RAW_OPS)} ops convert, built on the functions above "
        "(`layers/ops_tf.py`); any other is refused by name: " + ", ".join(f"`{o}`" for o in sorted(RAW_OPS)) + ".",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    with open(PAGE, "w") as f:
        f.write(page())
    print(f"wrote {PAGE}")
