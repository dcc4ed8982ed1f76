//! Generates the gRPC code from cairn's .proto files with a vendored protoc, so a fresh machine
//! needs nothing installed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // Read by prost-build when it runs protoc; this build script is single-threaded.
    std::env::set_var("PROTOC", protoc);
    tonic_prost_build::configure().bytes(".").compile_protos(
        &[
            "proto/etcdserverpb/rpc.proto",
            "proto/mvccpb/kv.proto",
            "proto/authpb/auth.proto",
            "proto/cairn/peer.proto",
        ],
        &["proto"],
    )?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
