"""Builds cudnn_rnn._C.

A CUDAExtension linked to cuDNN when torch was built with CUDA and nvcc is present (FORCE_CUDA=1
forces it, e.g. on a GPU-less builder; FORCE_CUDA=0 forbids it), a CppExtension otherwise. The
resolved configuration is printed.

cuDNN headers: $CUDNN_INCLUDE_DIR, else $CUDNN_HOME/include, else the nvidia-cudnn wheel that
torch brings, else the CUDA toolkit's include directory.
"""
import glob
import os
import sys

from setuptools import find_packages, setup

import shutil


def _find_cuda_home():
    """torch guesses CUDA_HOME as ../.. of the first nvcc on PATH, which is wrong when that nvcc
    is a symlink or a wrapper script (e.g. /usr/local/bin/nvcc); take the first candidate that
    has the runtime headers."""
    nvcc = shutil.which("nvcc")
    candidates = [os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))] if nvcc else []
    candidates += ["/usr/local/cuda"]
    for home in candidates:
        if os.path.isfile(os.path.join(home, "include", "cuda_runtime_api.h")) and os.path.isfile(
            os.path.join(home, "bin", "nvcc")
        ):
            return home
    return None


if not (os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")) and _find_cuda_home():
    os.environ["CUDA_HOME"] = _find_cuda_home()

try:
    import torch
    from torch.utils import cpp_extension
except ImportError:
    # pip's isolated build environment (plain `pip install .`) has no torch, and a torch installed
    # there would not be the user's: an extension built against it fails to import later.
    sys.exit("cudnn_rnn: building needs the torch you will run it with, and none is importable here. "
             "With pip, build in your own environment: `pip install --no-build-isolation .` "
             "(install torch first if it is missing: pip install torch).")

ROOT = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join("csrc")


def _cudnn_dirs():
    """(include_dir, lib_dir, where) for cuDNN, or raises with what was looked at."""
    looked = []
    env_inc = os.environ.get("CUDNN_INCLUDE_DIR")
    home = os.environ.get("CUDNN_HOME")
    candidates = []
    if env_inc:
        candidates.append((env_inc, os.environ.get("CUDNN_LIB_DIR"), "CUDNN_INCLUDE_DIR"))
    if home:
        candidates.append((os.path.join(home, "include"), os.path.join(home, "lib"), "CUDNN_HOME"))
    try:
        import nvidia.cudnn  # the wheel torch depends on

        base = list(nvidia.cudnn.__path__)[0]
        candidates.append((os.path.join(base, "include"), os.path.join(base, "lib"), "nvidia-cudnn wheel"))
    except ImportError:
        pass
    if cpp_extension.CUDA_HOME:
        candidates.append(
            (os.path.join(cpp_extension.CUDA_HOME, "include"), os.path.join(cpp_extension.CUDA_HOME, "lib64"), "CUDA toolkit")
        )
    for inc, lib, where in candidates:
        looked.append(f"{where}: {inc}")
        if os.path.isfile(os.path.join(inc, "cudnn.h")):
            return inc, lib, where
    raise RuntimeError("cuDNN headers (cudnn.h) not found; looked in:\n  " + "\n  ".join(looked))


def _cuda_library_headers():
    """Directories with the CUDA library headers ATen's CUDA headers include (cublas_v2.h,
    cusparse.h, ...) when the toolkit lacks them: the nvidia-* wheels torch brings. They go
    after every -I directory (-idirafter), so a full toolkit's own headers win."""
    dirs = []
    try:
        import nvidia

        for base in nvidia.__path__:
            for inc in sorted(glob.glob(os.path.join(base, "*", "include"))):
                if os.path.isfile(os.path.join(inc, "cusparse.h")) or os.path.isfile(os.path.join(inc, "cublas_v2.h")):
                    dirs.append(inc)
    except ImportError:
        pass
    return dirs


def _cudnn_link_args(lib_dir):
    if lib_dir and os.path.isfile(os.path.join(lib_dir, "libcudnn.so")):
        return [f"-L{lib_dir}", "-lcudnn", f"-Wl,-rpath,{lib_dir}"]
    if lib_dir and glob.glob(os.path.join(lib_dir, "libcudnn.so.*")):
        # The wheel ships only the versioned name; torch loads the same soname at import.
        so = sorted(glob.glob(os.path.join(lib_dir, "libcudnn.so.[0-9]*")))[0]
        return [f"-L{lib_dir}", f"-l:{os.path.basename(so)}", f"-Wl,-rpath,{lib_dir}"]
    return ["-lcudnn"]


def _libstdcxx_link_args():
    """Link the C++ runtime torch runs with (found in this process after `import torch`), by its
    soname. A compiler that carries only a static libstdc++ (a GCC installed beside the system's)
    would otherwise copy one into the extension: two C++ runtimes in one process, and the copy's
    streams crash on first use (std::ostringstream, so any error message)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/libstdc++.so.6" in line}
    except OSError:
        return []
    if len(paths) != 1:
        return []
    return [paths.pop()]  # a path given to the linker: no -L that could change what else it finds


def extension():
    force = os.environ.get("FORCE_CUDA")
    torch_cuda = torch.version.cuda is not None
    nvcc = cpp_extension.CUDA_HOME is not None
    if force == "1":
        if not (torch_cuda and nvcc):
            sys.exit(f"FORCE_CUDA=1 but torch.version.cuda={torch.version.cuda} and CUDA_HOME={cpp_extension.CUDA_HOME}")
        with_cuda = True
    elif force == "0":
        with_cuda = False
    else:
        with_cuda = torch_cuda and nvcc

    # csrc's rooms, bottom up (docs/architecture.md): core/ knows no backend; cpu/ and
    # cudnn_host/ (the cuDNN logic that runs on the host, tested on the CPU) build on it; cuda/
    # only in a CUDA build; bindings/ (the _C module and its _testing hooks) on top.
    sources = [os.path.join(CSRC, "core", f) for f in (
        "ops.cpp", "autograd.cpp", "rnn_config.cpp", "conv_lstm.cpp", "conv_lstm_autograd.cpp")]
    for room in ("cpu", "cudnn_host", "bindings"):
        sources += sorted(glob.glob(os.path.join(CSRC, room, "*.cpp")))
    # Warnings are errors in CI only (CUDNN_RNN_WERROR=1, .ci/run): a newer compiler's new warning
    # must not break a user's install.
    werror = os.environ.get("CUDNN_RNN_WERROR") == "1"
    warn = ["-Wall", "-Wextra", "-Wno-unused-parameter"] + (["-Werror"] if werror else [])
    # -fno-trapping-math lets GCC vectorise the branch-free activation loops (csrc/cpu/vec_loops*).
    # -g0: no debug information (Python's CFLAGS add -g: 28 MB instead of about 2);
    # CUDNN_RNN_DEBUG=1 keeps it.
    debug = os.environ.get("CUDNN_RNN_DEBUG") == "1"
    cxx = ["-O3", "-fno-trapping-math", "-fvisibility=hidden"] + ([] if debug else ["-g0"]) + warn
    # at::parallel_for is a header template: without -fopenmp (_OPENMP undefined) it compiles to a
    # serial loop, so the CPU backend's threads need it. Linking -fopenmp adds libgomp.so.1, the
    # soname torch itself loads (its own copy in torch/lib), so one OpenMP runtime is shared.
    openmp = torch.backends.openmp.is_available()
    libstdcxx = _libstdcxx_link_args()
    link = (["-fopenmp"] if openmp else []) + libstdcxx
    if openmp:
        cxx.append("-fopenmp")
    config = {
        "torch": torch.__version__,
        "torch.version.cuda": torch.version.cuda,
        "CUDA_HOME": cpp_extension.CUDA_HOME,
        "FORCE_CUDA": force,
        "openmp": "yes (at::parallel_for on torch's threads)" if openmp else "no (torch built without OpenMP)",
        "libstdc++": " ".join(libstdcxx) or "the compiler's",
        "warnings as errors": "yes (CUDNN_RNN_WERROR=1)" if werror else "no",
        "debug information": "yes (CUDNN_RNN_DEBUG=1)" if debug else "no",
    }
    if with_cuda:
        inc, lib, where = _cudnn_dirs()
        if not os.environ.get("TORCH_CUDA_ARCH_LIST") and not torch.cuda.is_available():
            os.environ["TORCH_CUDA_ARCH_LIST"] = "8.0;9.0"
        sources += sorted(glob.glob(os.path.join(CSRC, "cuda", "*.cpp")) + glob.glob(os.path.join(CSRC, "cuda", "*.cu")))
        after = [a for d in _cuda_library_headers() for a in ("-idirafter", d)]
        cxx = cxx + after
        config.update(
            backend="CUDAExtension (cuDNN + CPU)",
            cudnn_include=f"{inc} ({where})",
            extra_headers=" ".join(after[1::2]) or "-",
            cudnn_link=" ".join(_cudnn_link_args(lib)),
            TORCH_CUDA_ARCH_LIST=os.environ["TORCH_CUDA_ARCH_LIST"],
        )
        ext = cpp_extension.CUDAExtension(
            "cudnn_rnn._C",
            sources,
            include_dirs=[os.path.join(ROOT, CSRC), inc],
            extra_compile_args={"cxx": cxx, "nvcc": ["-O3"] + (["-Werror=all-warnings"] if werror else []) +
                                ["-Xcompiler", ",".join(warn)]},
            extra_link_args=_cudnn_link_args(lib) + link,
        )
    else:
        sources.append(os.path.join(CSRC, "core", "build_info_cpu_only.cpp"))
        config["backend"] = "CppExtension (CPU only)"
        ext = cpp_extension.CppExtension("cudnn_rnn._C", sources, include_dirs=[os.path.join(ROOT, CSRC)],
                                         extra_compile_args={"cxx": cxx},
                                         extra_link_args=link)
    print("cudnn_rnn build configuration:")
    for k, v in config.items():
        print(f"  {k}: {v}")
    BUILD_RECORD.update(config=config, with_cuda=with_cuda)
    return ext


BUILD_RECORD: dict = {}


class BuildExtension(cpp_extension.BuildExtension):
    """torch's BuildExtension, writing the build record (cudnn_rnn/_build.py) beside the extension
    it builds: into the source tree for an in-place build, into the build folder (the wheel) for an
    install, so that installing from a checkout leaves the checkout's own record alone."""

    def run(self):
        super().run()
        folder = ROOT if self.inplace else self.build_lib
        _write_build_record(BUILD_RECORD["config"], BUILD_RECORD["with_cuda"],
                            os.path.join(folder, "cudnn_rnn", "_build.py"))


def _write_build_record(config: dict, with_cuda: bool, path: str) -> None:
    """cudnn_rnn/_build.py: what this build was compiled against, in Python, so that the package
    can say what to do when the extension no longer fits the running torch (it cannot ask _C)."""
    record = {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda": "yes" if with_cuda else "no",
        "cuda_arches": config.get("TORCH_CUDA_ARCH_LIST", "-") if with_cuda else "-",
        "openmp": config["openmp"],
        "source": ROOT,
    }
    body = "".join(f"{k.upper()} = {v!r}\n" for k, v in record.items())
    os.makedirs(os.path.dirname(path), exist_ok=True)
    text = '"""Written by setup.py: what the native extension was built against (cudnn_rnn/__init__.py)."""\n' + body
    try:
        with open(path) as f:
            if f.read() == text:
                return  # unchanged: keep the incremental build's timestamps quiet
    except OSError:
        pass
    with open(path, "w") as f:
        f.write(text)


def _long_description() -> str:
    """The README, the package index page (the rest of the documentation is docs/)."""
    return open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()


setup(
    name="cudnn_rnn",
    version="0.1.0",
    description="Keras-exact LSTM/GRU/SimpleRNN/Bidirectional/ConvLSTM layers for PyTorch, in C++ (cuDNN, CPU), "
                "and Keras checkpoints loaded without TensorFlow",
    long_description=_long_description(),
    long_description_content_type="text/markdown",
    license="MIT",
    license_files=["LICENSE"],
    classifiers=[
        "License :: OSI Approved :: MIT License",
        "Programming Language :: Python :: 3",
        "Programming Language :: C++",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Typing :: Typed",
    ],
    packages=find_packages(include=["cudnn_rnn", "cudnn_rnn.*"]),
    package_data={"cudnn_rnn": ["py.typed"]},
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildExtension},
    python_requires=">=3.9",
    # The extension imports only under the torch it was built against (its C++ ABI): the wheel
    # says so, as torchvision's and torchaudio's do.
    install_requires=[f"torch=={torch.__version__.split('+')[0]}", "numpy", "h5py"],
    extras_require={"onnx": ["onnx", "onnxscript", "onnxruntime"]},
    entry_points={"console_scripts": ["cudnn-rnn = cudnn_rnn.cli:main"]},
)
