"""Detects the CUDA toolkit at /usr/local/cuda (or $CUDA_PATH).

Writes @local_cuda//:defs.bzl with CUDA_AVAILABLE. Where no toolkit exists (a CPU-only machine)
the repository still exists, CUDA_AVAILABLE is False, and the CUDA targets are not defined, so
`bazel build //...` succeeds without them.
"""

def _local_cuda_impl(ctx):
    root = ctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    nvcc = ctx.path(root + "/bin/nvcc")
    available = nvcc.exists
    ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % ctx.name)
    ctx.file("defs.bzl", "CUDA_AVAILABLE = %s\nCUDA_ROOT = %s\n" % (available, repr(root)))
    if not available:
        ctx.file("BUILD.bazel", "# No CUDA toolkit at %s: CUDA targets are skipped.\n" % root)
        return
    ctx.symlink(root + "/include", "include")
    ctx.file("BUILD.bazel", """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "cuda_headers",
    # CUDA 13 keeps libcu++/CUB/Thrust (and nv/target, which cuda_fp16.h includes) under
    # include/cccl, with extension-less headers.
    hdrs = glob(["include/**"]),
    includes = ["include", "include/cccl"],
)

cc_library(
    name = "cuda_runtime",
    linkopts = ["-L{root}/lib64", "-Wl,-rpath,{root}/lib64", "-lcudart", "-lcublasLt", "-lnccl"],
    deps = [":cuda_headers"],
)
""".format(root = root))

local_cuda = repository_rule(
    implementation = _local_cuda_impl,
    local = True,
    environ = ["CUDA_PATH"],
)
