"""cc_grpc_proto: C++ protobuf + gRPC code generation with the system protoc and plugin."""

def cc_grpc_proto(name, src, deps = [], visibility = None):
    """Generates <base>.pb.{h,cc} and <base>.grpc.pb.{h,cc} from `src` and wraps them.

    Args:
      name: the cc_library's name.
      src: one .proto file, path relative to the package; imports are resolved from the
        package, so //proto's `kvrm/v1/x.proto` is included as "kvrm/v1/x.pb.h".
      deps: other cc libraries the generated code needs.
      visibility: visibility of the library.
    """
    base = src[:-len(".proto")]
    outs = [base + ext for ext in [".pb.h", ".pb.cc", ".grpc.pb.h", ".grpc.pb.cc"]]
    native.genrule(
        name = name + "_gen",
        srcs = [src],
        outs = outs,
        cmd = ("protoc -I{pkg} --cpp_out=$(GENDIR)/{pkg} --grpc_out=$(GENDIR)/{pkg} " +
               "--plugin=protoc-gen-grpc=$$(command -v grpc_cpp_plugin) {pkg}/{src}").format(
            pkg = native.package_name(),
            src = src,
        ),
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        includes = ["."],
        deps = deps + ["@system//:grpcpp", "@system//:protobuf"],
        visibility = visibility,
    )
