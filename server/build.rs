//! Generates the gRPC code from cairn's .proto files with a vendored protoc, so a fresh machine
//! needs nothing installed; and the Watch service's server once more by hand, with a codec of
//! cairn's own (`api/watch/wire.rs`), so events shared by many watchers are encoded once.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // Read by prost-build when it runs protoc; this build script is single-threaded.
    std::env::set_var("PROTOC", protoc);
    // The descriptors too, for the HTTP/JSON gateway's transcoding (`gateway.rs`).
    let descriptors = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("descriptors.bin");
    tonic_prost_build::configure()
        .bytes(".")
        .file_descriptor_set_path(descriptors)
        .compile_protos(
            &[
                "proto/etcdserverpb/rpc.proto",
                "proto/mvccpb/kv.proto",
                "proto/authpb/auth.proto",
                "proto/v3electionpb/v3election.proto",
                "proto/v3lockpb/v3lock.proto",
                "proto/cairn/peer.proto",
            ],
            &["proto"],
        )?;
    // Same route as the generated one (/etcdserverpb.Watch/Watch); only its server is used.
    let watch = tonic_build::manual::Service::builder()
        .name("Watch")
        .package("etcdserverpb")
        .method(
            tonic_build::manual::Method::builder()
                .name("watch")
                .route_name("Watch")
                .input_type("crate::pb::etcdserverpb::WatchRequest")
                .output_type("crate::api::watch::wire::WireResponse")
                .codec_path("crate::api::watch::wire::WatchCodec")
                .client_streaming()
                .server_streaming()
                .build(),
        )
        .build();
    tonic_build::manual::Builder::new()
        .build_client(false)
        .compile(&[watch]);
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
