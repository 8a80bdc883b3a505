"""Wraps system libraries (Debian packages) as Bazel cc_library targets via pkg-config.

Headers live under /usr/include, which the auto-configured toolchain already searches, so only
link options are declared. A library whose .pc file is missing fails the fetch with its name.
"""

# target name -> (pkg-config modules, extra linkopts)
_LIBS = {
    "absl": ([
        "absl_flags",
        "absl_flags_parse",
        "absl_flags_usage",
        "absl_status",
        "absl_statusor",
        "absl_str_format",
        "absl_strings",
        "absl_synchronization",
        "absl_time",
        "absl_hash",
        "absl_raw_hash_set",
        "absl_random_random",
        "absl_cord",
    ], []),
    "protobuf": (["protobuf"], []),
    "grpcpp": (["grpc++"], ["-lgrpc++_reflection"]),
    "gtest": (["gtest", "gmock"], []),
    "gtest_main": (["gtest_main", "gmock"], []),
    "benchmark": (["benchmark"], []),
    "oniguruma": (["oniguruma"], []),
    "icu": (["icu-uc", "icu-i18n"], []),
    "microhttpd": (["libmicrohttpd"], []),
}

def _pkg_config(ctx, modules):
    res = ctx.execute(["pkg-config", "--libs"] + modules)
    if res.return_code != 0:
        fail("pkg-config --libs %s failed (install the Debian -dev package): %s" %
             (" ".join(modules), res.stderr))
    opts = []
    for opt in res.stdout.strip().split(" "):
        if opt and opt not in opts:
            opts.append(opt)
    return opts

def _system_libs_impl(ctx):
    lines = ['package(default_visibility = ["//visibility:public"])', ""]
    for name, (modules, extra) in _LIBS.items():
        opts = _pkg_config(ctx, modules) + extra
        lines.append("cc_library(")
        lines.append('    name = "%s",' % name)
        lines.append("    linkopts = %s," % repr(opts + ["-lpthread"]))
        lines.append(")")
        lines.append("")
    ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % ctx.name)
    ctx.file("BUILD.bazel", "\n".join(lines))

system_libs = repository_rule(
    implementation = _system_libs_impl,
    local = True,
    environ = ["PKG_CONFIG_PATH"],
)
