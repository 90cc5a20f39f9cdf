//! Compiles the agent's part of the CRI v1 API with protox (no protoc needed).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(["cri.proto"], ["proto"])?;
    tonic_build::configure()
        .build_server(false)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
