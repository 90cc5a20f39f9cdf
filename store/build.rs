//! Compiles the etcd v3 API and the peer protocol with protox (no protoc needed).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(["rpc.proto", "peer.proto"], ["proto"])?;
    tonic_build::configure()
        // Watch events go to many watchers from one stored version: shared buffers, no copies.
        .bytes([".mvccpb.KeyValue"])
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
