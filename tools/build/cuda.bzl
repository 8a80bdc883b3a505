"""cuda_library: compiles .cu files with the toolkit's nvcc (sm_80 and sm_90) into a cc_library.

Used only inside `if CUDA_AVAILABLE:` blocks (see third_party/cuda.bzl), so a machine without
the toolkit never sees these targets.
"""

load("@local_cuda//:defs.bzl", "CUDA_ROOT")

_ARCHS = [
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
]

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], visibility = None):
    """Compiles each .cu in `srcs` with nvcc, archives the objects, wraps them as a cc_library.

    Args:
      name: the cc_library's name.
      srcs: .cu files.
      hdrs: headers (.h, .cuh) the .cu files and dependents include.
      deps: cc_library deps (their headers must be self-contained for nvcc too).
      copts: extra nvcc flags.
      visibility: as usual.
    """
    objs = []
    for src in srcs:
        obj = src.replace(".cu", ".o")
        native.genrule(
            name = name + "_" + src.replace("/", "_").replace(".", "_"),
            srcs = [src] + hdrs,
            outs = [obj],
            # nvcc names its temporary files after its process id, which is the same (2) in
            # every sandbox's PID namespace: two sandboxes sharing /tmp then collide ("cannot
            # open module id file"). Each compile gets a private TMPDIR.
            cmd = ("t=$$(mktemp -d) && TMPDIR=$$t {nvcc} -c -O3 -std=c++17 {archs} -Xcompiler " +
                   "-fPIC -I. -I$(GENDIR) --expt-relaxed-constexpr {copts} $(location {src}) " +
                   "-o $@; rc=$$?; rm -rf $$t; exit $$rc").format(
                nvcc = CUDA_ROOT + "/bin/nvcc",
                archs = " ".join(_ARCHS),
                copts = " ".join(copts),
                src = src,
            ),
        )
        objs.append(obj)
    native.genrule(
        name = name + "_archive",
        srcs = objs,
        outs = ["lib" + name + "_cuda.a"],
        cmd = "ar rcs $@ $(SRCS)",
    )
    native.cc_library(
        name = name,
        srcs = ["lib" + name + "_cuda.a"],
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cuda_runtime"],
        linkstatic = True,
        alwayslink = True,
        visibility = visibility,
    )
