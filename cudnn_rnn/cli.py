"""cudnn-rnn: convert, inspect and verify Keras recurrent models.

    cudnn-rnn convert MODEL OUT [--architecture ARCH]   OUT.pt: config + weights + state_dict
                                                        (reload with cudnn_rnn.keras.load_converted);
                                                        OUT.pt2: a torch.export program;
                                                        OUT.onnx: ONNX (LSTM / GRU / RNN operators)
    cudnn-rnn inspect MODEL [--architecture ARCH]       layers, weights, parameters, CUDA backend
    cudnn-rnn verify MODEL [--architecture ARCH]        run Keras (if installed) and ours on random
                                                        inputs, report the max abs error (exit 1: above
                                                        --tolerance; 2: the file cannot be converted;
                                                        3: Keras itself cannot load or run it)
Progress is shown on a terminal (--no-progress to silence, --progress to force).
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional

import numpy as np
import torch


def _progress(stream):
    def report(i, n, name):
        print(f"\r[{i + 1}/{n}] {name[:60]:60s}", end="", file=stream, flush=True)
        if i + 1 == n:
            print(file=stream)

    return report


def _say(args, what: str) -> None:
    """A long step, announced where progress is shown (a terminal, or --progress)."""
    if args.progress:
        print(f"[cudnn-rnn] {what} ...", file=sys.stderr, flush=True)


def _load(args):
    from .keras import load_keras

    _say(args, f"converting {args.model}")
    return load_keras(args.model, architecture=args.architecture, progress=_progress(sys.stderr) if args.progress else None,
                      backend=args.backend)


def _listed(outputs, structure) -> list:
    """A model's outputs as a flat list, nested lists and dicts walked as structure (a converted
    model's output_structure) nests them, in its order (a dict's keys as the model lists them);
    without one, a list or tuple as it is, one tensor as a list of one."""
    if isinstance(structure, dict):
        return [x for k, s in structure.items() for x in _listed(outputs[k], s)]
    if isinstance(structure, list):
        return [x for i, s in enumerate(structure) for x in _listed(outputs[i], s)]
    if structure is not None:
        return [outputs]
    return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]


def _onnx_names(path: str):
    """(input names, output names) as the .onnx file holds them: what onnxruntime is fed and
    returns by (its weights, listed as inputs by some exporters, left out)."""
    import onnx

    graph = onnx.load(path, load_external_data=False).graph
    weights = {w.name for w in graph.initializer}
    return [i.name for i in graph.input if i.name not in weights], [o.name for o in graph.output]


def _check_onnx(path: str, model, inputs) -> int:
    """The exported file run in onnxruntime against the model itself on the example inputs (float
    ones replaced by seeded values in [-1, 1): zeros would leave the kernels unread; token ids
    padded with id 0 on the right in the first row and on the left in the last, so that
    mask_zero masks are exercised): 0, or 3 (as verify's oracle failures) when they differ by
    more than 1e-4 (relative to outputs above 1)."""
    try:
        import onnxruntime
    except ImportError:
        print("(pip install onnxruntime to have the export checked against the model)")
        return 0
    gen = torch.Generator().manual_seed(0)

    def varied(a):
        if a.is_floating_point():
            return torch.rand(a.shape, generator=gen, dtype=a.dtype) * 2 - 1
        if a.dtype != torch.bool and a.dim() == 2 and a.shape[1] >= 3:  # token ids: id 0 pads (mask_zero)
            a = a.clone()
            a[0, -2:] = 0  # right padding
            a[-1, :2] = 0  # left padding (Keras's pad_sequences default)
        return a

    inputs = tuple(varied(a) for a in inputs)
    runtime = onnxruntime.InferenceSession(path)
    got = runtime.run(None, {i.name: a.numpy() for i, a in zip(runtime.get_inputs(), inputs)})
    with torch.no_grad():
        ref = _listed(model(*inputs), getattr(model, "output_structure", None))
    overflows = not all(torch.isfinite(r).all() for r in ref)

    def differ(g, r):
        """NaN on both sides and equal infinities agree (a model can compute them). Where the
        model's own outputs overflow on these inputs, the runtime's order of operations may turn
        an infinity into NaN, or a NaN into a number (its ReduceMax skips NaN): only the outputs
        both give finite are compared then."""
        same = (np.isnan(g) & np.isnan(r)) | (g == r)
        if overflows:
            same |= ~(np.isfinite(g) & np.isfinite(r))
        gap = np.where(same, 0.0, np.abs(g - r))
        # 1e-4, relative to values above 1 (float32's rounding grows with them)
        return float(np.max(gap, initial=0.0)), bool((gap > 1e-4 * np.maximum(1.0, np.abs(r))).any())

    pairs = [differ(g, r.numpy()) for g, r in zip(got, ref)]
    diff, beyond = max(p[0] for p in pairs), any(p[1] for p in pairs)
    if len(got) != len(ref) or beyond or diff != diff:
        print(f"cudnn-rnn: {path}: onnxruntime's outputs differ from the model's on example inputs "
              f"(max |onnx - ours| = {diff:.3g}, {len(got)} outputs against {len(ref)}): please report it",
              file=sys.stderr)
        return 3
    where = " where both are finite (the model's outputs overflow on these inputs)" if overflows else ""
    print(f"checked in onnxruntime {onnxruntime.__version__}: max |onnx - ours| = {diff:.2g} on example inputs{where}")
    return 0


OUTPUT_KINDS = (".pt", ".pt2", ".onnx")


def _program_lengths(program, free) -> dict:
    """Per free input, the fewest steps the exported program's guards admit (torch.export may
    raise an input's lower bound above the one it was asked for without a word)."""
    names = list(program.graph_signature.user_inputs)
    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    lowest = {}
    for i, name in enumerate(names):
        val = nodes[name].meta.get("val") if name in nodes else None
        if i not in free or not isinstance(val, torch.Tensor) or val.dim() < 2 or not isinstance(val.shape[1], torch.SymInt):
            continue
        bounds = program.range_constraints.get(val.shape[1].node.expr)
        if bounds is not None:
            lowest[i] = int(bounds.lower)
    return lowest


def _say_inputs(free, minimum: int, example, lowest: Optional[dict] = None, names=None) -> None:
    """What the exported program takes: each input's dtype and dimensions (an input's own fewest
    steps from `lowest` where the program says more than `minimum`), after its name where the
    program names it (`names`: an .onnx file's (inputs, outputs))."""
    described = []
    for i, x in enumerate(example):
        dims = ["batch"] + [str(d) for d in x.shape[1:]]
        if i in free:
            least = max(minimum, (lowest or {}).get(i, minimum))
            dims[1] = f"time >= {least}" if least > 2 else "time"
        described.append((f"{names[0][i]}: " if names else "") + f"{str(x.dtype).replace('torch.', '')} [{', '.join(dims)}]")
    print("the program takes " + "; ".join(described))
    if names and names[1]:
        print("its outputs: " + ", ".join(names[1]))
    minimum = max([minimum] + [v for k, v in (lowest or {}).items() if k in free])
    if free and minimum > 2:
        print(f"(sequences of {minimum} steps or more: the lengths over which torch.export proves the model's "
              "shapes, which its convolutions, pooling or slices over time limit)")


def _refused_lengths(args, error: BaseException, what: str) -> bool:
    """Says, for an export torch.export found no range of lengths for, why (True); False for any
    other failure."""
    from ._export_shapes import length_failure

    why = length_failure(error)
    if why is None:
        return False
    advice = "export it at the lengths the file declares (without --any-length)" if args.any_length else \
        "please report it"
    print(f"cudnn-rnn: {args.out}: cannot be exported{what} for any length: {why}; {advice}", file=sys.stderr)
    return True


def _failing_layer(error: BaseException):
    """(the layer, a path through nested models, whose call raised while the model was traced:
    the `name` of each forward_with_masks frame on the traceback, outermost first; the exception
    it raised) for `error` or the exceptions it was raised from (an exporter's wrapper), else
    ("", None)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        names, tb = [], error.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            if frame.f_code.co_name == "forward_with_masks" and isinstance(frame.f_locals.get("name"), str):
                names.append(frame.f_locals["name"])
            tb = tb.tb_next
        if any(names):
            return "/".join(n for n in names if n), error
        error = error.__cause__ or error.__context__
    return "", None


def _refused_export(args, model, error: BaseException, what: str) -> None:
    """Says, in one line, why torch.export could not trace the model (a layer whose output's
    shape or control flow the data decides), naming the layer."""
    layer, raised = _failing_layer(error)
    error = raised or error
    kind = next((l.class_name for l in model.spec.layers if l.name == layer), "") if layer else ""
    where = f"layer '{layer}'{f' ({kind})' if kind else ''}" if layer else "the model"
    print(f"cudnn-rnn: {args.out}: cannot be exported{what}: {where} computes what torch.export cannot trace "
          f"({type(error).__name__}: {_first_line(error)}); convert to .pt and run it in Python", file=sys.stderr)


def _eager_failure(model, inputs):
    """Why the model does not run on these inputs (one line), or None where it does."""
    try:
        with torch.no_grad():
            model(*inputs)
        return None
    except Exception as e:  # noqa: BLE001 - a layer's own error, told in one line
        return " ".join(str(e).split())[:300]
    finally:
        model.reset_states()


def cmd_convert(args) -> int:
    import os

    from .keras.convert import save_converted
    from .keras.graph.model import layer_name

    if not args.out.endswith(OUTPUT_KINDS):
        print(f"cudnn-rnn: {args.out}: the output must end in .pt (config + weights), .pt2 (torch.export program) "
              "or .onnx", file=sys.stderr)
        return 2
    folder = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(folder):
        print(f"cudnn-rnn: {args.out}: the folder {folder} does not exist", file=sys.stderr)
        return 2
    if args.out.endswith(".onnx"):
        from .onnx import _require_exporter

        try:  # before the conversion, which a large model takes a while over
            _require_exporter()
        except ImportError as e:
            print(f"cudnn-rnn: {args.out}: {e}", file=sys.stderr)
            return 2
    model = _load(args)
    if args.out.endswith((".pt2", ".onnx")):
        import contextlib
        import io
        import logging

        from ._export_shapes import export_from_length

        # A failed trace: torch prints the partial graph to stderr and its shape solver logs
        # warnings; this command says in one line what failed, and where.
        logging.getLogger("torch.fx.experimental.symbolic_shapes").setLevel(logging.ERROR)

        def quiet(fn):
            def run(*a):
                with contextlib.redirect_stderr(io.StringIO()):
                    return fn(*a)
            return run

        strings = model.string_inputs()
        if strings:
            print(f"cudnn-rnn: {args.out}: the model takes strings (input {strings[0]}: a string layer reads "
                  "it), which an exported program cannot; convert to .pt and run it in Python",
                  file=sys.stderr)
            return 2

        free = model.length_inputs(args.any_length)  # each input its own length
        fixed = [f"input {i}: {model.input_specs[i][1][1]}" for i in model.length_inputs(True) if i not in free]
        if fixed:
            print(f"cudnn-rnn: the file declares fixed lengths ({', '.join(fixed)}), which the export keeps; "
                  "--any-length makes them dynamic", file=sys.stderr)
        # The fewest steps the model runs on (a valid convolution or a pooling over time needs
        # some); the example inputs twice as long (at least 5), so that no length inside the
        # model is 1 in the trace.
        shortest = model.shortest_length(any_length=args.any_length) if free else 2
        batch = torch.export.Dim("batch", min=1)
        # the Keras names of the stateful layers (module paths layers.<name>[.layer ...])
        stateful = sorted({layer_name(name.split(".")[1]) if name.startswith("layers.") else name
                           for name, m in model.named_modules() if getattr(m, "stateful", False)})
        if stateful:
            print(f"cudnn-rnn: {args.out}: the exported program keeps no state between calls: its stateful layers "
                  f"({', '.join(stateful[:4])}{', ...' if len(stateful) > 4 else ''}) start "
                  "every call from zero states, as after reset_states(); to carry the states, export a module that "
                  "takes them and returns them (docs/guides/serving.md)", file=sys.stderr)
            model.reset_states()  # (states a SavedModel kept would be traced in as constants)

        def shapes_from(minimum):
            return (tuple({0: batch, 1: torch.export.Dim(f"time_{i}", min=minimum)} if i in free else {0: batch}
                          for i in range(len(model.input_specs))),)

        def example(minimum):
            return tuple(model.example_inputs(time=max(5, 2 * minimum), any_length=args.any_length))

        if free:  # a model that runs at no length but the declared one (a reshape to a fixed size)
            failure = _eager_failure(model, example(shortest))
            if failure is not None:
                advice = "export it at the lengths the file declares (without --any-length)" if args.any_length \
                    else "its layers hold at particular lengths only"
                print(f"cudnn-rnn: {args.out}: cannot be exported for any length: the model does not run on "
                      f"{max(5, 2 * shortest)} steps ({failure}); {advice}", file=sys.stderr)
                return 2

    if args.out.endswith(".onnx"):
        from .onnx import OnnxExportError, export

        _say(args, "exporting to ONNX (dynamic batch and time)")
        try:
            _, minimum = export_from_length(
                quiet(lambda shapes, m: export(model, example(m), args.out, dynamic_shapes=shapes)), shapes_from,
                shortest, 1024, probe=quiet(lambda shapes, m: torch.export.export(model, example(m),
                                                                                  dynamic_shapes=shapes)))
        except OnnxExportError as e:
            print(f"cudnn-rnn: {args.out}: cannot be exported to ONNX: {e}", file=sys.stderr)
            return 2
        except Exception as e:  # noqa: BLE001 - torch's: no range of lengths holds, or a layer it cannot trace
            if not _refused_lengths(args, e, " to ONNX"):
                _refused_export(args, model, e, " to ONNX")
            return 2
        status = _check_onnx(args.out, model, example(minimum))
        if status:
            return status
        _say_inputs(free, minimum, example(minimum), names=_onnx_names(args.out))
        print("run it with onnxruntime (onnxruntime.InferenceSession); inputs by those names, any mask")
    elif args.out.endswith(".pt2"):
        # forward(*inputs): the varargs are one packed argument for export
        _say(args, "exporting with torch.export (dynamic batch and time)")
        try:
            program, minimum = export_from_length(
                quiet(lambda shapes, m: torch.export.export(model, example(m), dynamic_shapes=shapes)), shapes_from,
                shortest, 1024)
        except Exception as e:  # noqa: BLE001 - torch's: no range of lengths holds, or a layer it cannot trace
            if not _refused_lengths(args, e, ""):
                _refused_export(args, model, e, "")
            return 2
        torch.export.save(program, args.out)
        _say_inputs(free, minimum, example(minimum), _program_lengths(program, free))
        print("load it with: import cudnn_rnn, torch; torch.export.load(PATH) (the program calls cudnn_rnn's ops, "
              "which `import cudnn_rnn` registers)")
    else:
        save_converted(model, args.out)
    params = sum(p.numel() for p in model.parameters())
    print(f"wrote {args.out}: {len(model.layers)} layers, {params} parameters (Keras {model.keras_version or '?'})")
    return 0


def _describe(module) -> str:
    from .explain import explain
    from .keras import recurrent_layers

    return "; ".join(str(explain(layer, "cuda")) for layer in recurrent_layers(module)) or "-"


def cmd_inspect(args) -> int:
    from .keras.layers.quantized import policy_mode

    model = _load(args)
    rows = [("layer", "class", "weights", "params", "on CUDA")]
    for layer in model.spec.layers:
        module = model.layer(layer.name)
        shapes = [tuple(np.shape(a)) for take in model.keras_weights.get(layer.name, []) for g in take for a in g]
        params = sum(int(np.prod(s)) for s in shapes)
        mode = policy_mode(layer.config.get("dtype")) if isinstance(layer.config, dict) else None
        rows.append((layer.name, layer.class_name + (f" ({mode})" if mode else ""),
                     " ".join(str(s) for s in shapes) or "-", str(params), _describe(module)))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4])
    print(f"Keras version {model.keras_version or 'unknown'}; inputs {model.input_specs}")
    return 0


def cmd_verify(args) -> int:
    import os

    os.environ.setdefault("KERAS_BACKEND", "torch")
    try:
        import keras
    except ImportError:
        print("verify needs Keras 3 installed (pip install keras)", file=sys.stderr)
        return 2
    model = _load(args)
    # The reference computes on the CPU, in full float32 as ours does: on a machine with a GPU,
    # Keras's torch backend would place it on CUDA, where torch runs convolutions in TF32.
    with keras.device("cpu"):
        return _verify_against(args, model, keras)


def _verify_against(args, model, keras) -> int:
    _say(args, f"loading {args.model} with Keras {keras.__version__} (the reference)")
    try:
        if args.architecture:
            reference = keras.models.model_from_json(json.dumps(model.keras_config))
            reference.load_weights(args.model)
        else:
            reference = keras.saving.load_model(args.model, compile=False)
    except Exception as e:  # noqa: BLE001 - the oracle's own failure, reported as such
        first = _first_line(e)
        writer = f"written by Keras {model.keras_version}" if model.keras_version else "its writer unknown"
        print(f"cudnn-rnn: Keras {keras.__version__} itself cannot load {args.model} ({writer}; {type(e).__name__}: "
              f"{first}); the conversion loaded, but Keras gives nothing to compare it with.", file=sys.stderr)
        return 3
    from .keras.layers.registry import keras_major

    redefined = _keras2_hard_sigmoid(reference, keras) if keras_major(model.keras_version) < 3 else 0
    if redefined:
        print(f"(the reference computes hard_sigmoid as Keras {model.keras_version or '2'}, which wrote the file, defined "
              f"it: clip(0.2 x + 0.5, 0, 1); Keras 3 redefined it as clip(x / 6 + 0.5, 0, 1); {redefined} "
              f"activation(s))")
    if args.time is None:
        args.time = model.shortest_length(at_least=7)
    rng = np.random.RandomState(args.seed)
    fallback = _min_vocab(model.keras_config)
    inputs = []
    for (dtype, shape), vocab in zip(model.input_specs, model.input_vocabularies()):
        dims = [args.batch] + [args.time if d is None else int(d) for d in shape[1:]]
        if dtype == "string":  # words, for the string layers (text, hashing)
            words = np.array(["the", "cat", "sat", "on", "a", "mat", "Dog", "birds!"], dtype=object)
            length = args.time if dims[-1] == 1 else 1  # sentences in [batch, 1]; words elsewhere
            inputs.append(np.array([" ".join(rng.choice(words, size=length)) for _ in range(int(np.prod(dims)))],
                                   dtype=object).reshape(dims))
        elif "int" in dtype or vocab is not None:  # ids (an Embedding reads float ids as whole numbers too)
            x = rng.randint(0, vocab or fallback, size=dims)
            if len(dims) > 1 and dims[1] > 2:
                x[0, -2:] = 0  # some padding, for masks
            inputs.append(x.astype(np.int64 if "int" in dtype else np.float32))
        else:
            inputs.append(rng.standard_normal(dims).astype(np.float32))
    _say(args, f"running Keras and ours on random inputs (batch {args.batch}, time {args.time})")
    try:
        # a model built on a dict of inputs takes them keyed (in the order of model.input_keys)
        given = (dict(zip(model.input_keys, inputs)) if model.spec.input_keys
                 else inputs if len(inputs) > 1 else inputs[0])
        expected = reference(given, training=False)
    except Exception as e:  # noqa: BLE001
        first = _first_line(e)
        print(f"cudnn-rnn: Keras could not run the model it loaded ({type(e).__name__}: {first})", file=sys.stderr)
        return 3
    try:
        expected = _listed(expected, model.output_structure)
    except (KeyError, IndexError, TypeError):
        print(f"cudnn-rnn: Keras returned its outputs nested otherwise than the converted model "
              f"({type(expected).__name__} against {type(model.output_structure).__name__})", file=sys.stderr)
        return 1
    try:
        with torch.no_grad():
            ours = model(*[x if x.dtype == object else torch.as_tensor(x) for x in inputs])
    except Exception as e:  # noqa: BLE001 - reported as a disagreement with Keras
        first = _first_line(e)
        print(f"cudnn-rnn: the converted model failed on the inputs Keras ran ({type(e).__name__}: {first})",
              file=sys.stderr)
        return 1
    ours = _listed(ours, model.output_structure)
    worst = max(float(np.max(np.abs(o.numpy() - keras.ops.convert_to_numpy(e)))) for o, e in zip(ours, expected))
    print(f"max abs error against Keras {keras.__version__}: {worst:.3e} over {len(ours)} output(s)")
    return 0 if worst <= args.tolerance else 1


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [""])[0][:300]


def _keras2_hard_sigmoid(reference, keras) -> int:
    """Gives every layer (and cell) of a Keras 3 model whose activation is Keras 3's hard_sigmoid
    Keras 2's instead, the function a file from Keras 2 was trained with (and load_keras keeps):
    how many it replaced."""
    def keras2(x):
        return keras.ops.clip(0.2 * x + 0.5, 0.0, 1.0)

    count = 0
    for layer in reference._flatten_layers(include_self=False, recursive=True):
        for attr in ("activation", "recurrent_activation"):
            if isinstance(getattr(type(layer), attr, None), property):
                continue  # a recurrent layer's view of its cell's, which the loop reaches too
            if getattr(layer, attr, None) is keras.activations.hard_sigmoid:
                setattr(layer, attr, keras2)
                count += 1
    return count


def _min_vocab(config) -> int:
    found = []

    def walk(c):
        if isinstance(c, dict):
            if c.get("class_name") == "Embedding" and isinstance(c.get("config"), dict):
                found.append(int(c["config"]["input_dim"]))
            for v in c.values():
                walk(v)
        elif isinstance(c, list):
            for v in c:
                walk(v)

    walk(config)
    return min(found) if found else 2


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="cudnn-rnn", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    from . import __version__

    parser.add_argument("--version", action="version", version=f"cudnn-rnn {__version__} (torch {torch.__version__})")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("convert", "inspect", "verify"):
        p = sub.add_parser(name)
        p.add_argument("model", help=".keras, .h5, .weights.h5 or .weights.json file, unzipped Keras model or "
                                     "SavedModel directory, or TensorFlow checkpoint prefix")
        if name == "convert":
            p.add_argument("out", help="OUT.pt (config + weights), OUT.pt2 (torch.export program) or OUT.onnx")
            p.add_argument("--any-length", action="store_true",
                           help=".pt2 / .onnx: make every sequence length dynamic, also those the file declares "
                                "fixed (the converted model takes any length)")
        p.add_argument("--architecture", help="model file or JSON config, for weights-only files")
        p.add_argument("--backend", choices=("tensorflow", "jax", "torch"),
                       help="the backend of the Keras that wrote a file that does not record it (Keras 3 .keras): "
                            "bicubic resizes and sobel_edges follow it")
        p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=sys.stderr.isatty(),
                       help="report each long step and each layer as it is converted (default: on a terminal)")
        if name == "verify":
            p.add_argument("--batch", type=int, default=4, help="rows of the random inputs (default %(default)s)")
            p.add_argument("--time", type=int, default=None,
                           help="length of the random inputs where the file declares none (default: 7, or the "
                                "fewest steps the model runs on where its convolutions or pooling need more)")
            p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default %(default)s)")
            p.add_argument("--tolerance", type=float, default=1e-5,
                           help="largest absolute error accepted; above it verify exits 1 (default %(default)s)")
    args = parser.parse_args(argv)
    from .keras.errors import ConversionError

    try:
        return {"convert": cmd_convert, "inspect": cmd_inspect, "verify": cmd_verify}[args.command](args)
    except ConversionError as e:
        hint = ""
        if "pass architecture=" in str(e) or "architecture" in str(e) and "weights only" in str(e):
            hint = " (on the command line: --architecture MODEL.keras|MODEL.h5|CONFIG.json)"
        print(f"cudnn-rnn: {e}{hint}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
