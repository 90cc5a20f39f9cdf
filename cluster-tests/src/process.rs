//! Running a client program (etcdctl, kubectl) once: input on its stdin, its output collected,
//! bounded in time.

use std::process::Stdio;
use std::time::Duration;

/// What one run of a program did.
pub struct Ran {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `cmd` with `input` on its standard input; panics (failing the test) if it runs longer
/// than `timeout` or cannot start.
pub async fn run(
    mut cmd: tokio::process::Command,
    input: &str,
    timeout: Duration,
    what: &str,
) -> Ran {
    use tokio::io::AsyncWriteExt;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what} does not start: {e}"));
    let mut stdin = child.stdin.take().expect("piped stdin");
    let input = input.to_string();
    let feed = async move {
        // The program may exit before reading everything (a refused command): not our failure.
        let _ = stdin.write_all(input.as_bytes()).await;
    };
    let (_, out) = tokio::time::timeout(
        timeout,
        futures::future::join(feed, child.wait_with_output()),
    )
    .await
    .unwrap_or_else(|_| panic!("{what} did not finish within {timeout:?}"));
    let out = out.unwrap_or_else(|e| panic!("{what}'s output cannot be read: {e}"));
    Ran {
        success: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}
