//! A pseudo-terminal for the commands a user runs on one (`kubectl attach -it`,
//! `kubectl run -it`): the command gets the terminal's far end as its stdin, stdout and stderr
//! and as its controlling terminal; the test types on the near end, reads what the command
//! writes and resizes the window (which sends the command SIGWINCH).

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Result};

/// A command running on a terminal of its own.
pub struct Terminal {
    child: tokio::process::Child,
    master: File,
    output: tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>,
    /// Everything the command wrote so far.
    seen: String,
}

fn winsize(rows: u16, cols: u16) -> libc::winsize {
    libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

impl Terminal {
    /// Starts `cmd` on a new terminal of `rows` x `cols`.
    pub fn spawn(mut cmd: tokio::process::Command, rows: u16, cols: u16) -> Result<Terminal> {
        let (mut master, mut slave) = (-1, -1);
        let size = winsize(rows, cols);
        // SAFETY: openpty writes two descriptors into the integers given and reads the size.
        let rc = unsafe {
            libc::openpty(
                &mut master,
                &mut slave,
                std::ptr::null_mut(),
                std::ptr::null(),
                &size,
            )
        };
        if rc != 0 {
            bail!("openpty: {}", std::io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just opened and are owned here alone.
        let (master, slave) = unsafe { (File::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
        let slave = File::from(slave);
        cmd.stdin(Stdio::from(slave.try_clone()?))
            .stdout(Stdio::from(slave.try_clone()?))
            .stderr(Stdio::from(slave))
            .kill_on_drop(true);
        // SAFETY: only async-signal-safe calls between fork and exec: a new session whose
        // controlling terminal is the one on stdin.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn()?;
        // The far end's copies went to the child with the command (dropped here), so reading the
        // near end fails (EIO) once the command and its children have closed it.
        drop(cmd);
        let mut reader = master.try_clone()?;
        let (tx, output) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                    return;
                }
            }
        });
        Ok(Terminal {
            child,
            master,
            output,
            seen: String::new(),
        })
    }

    /// Types `text` (a `\r` is the Enter key).
    pub fn type_text(&mut self, text: &str) {
        self.master
            .write_all(text.as_bytes())
            .and_then(|_| self.master.flush())
            .expect("typing on the terminal");
    }

    /// Resizes the window, as a user dragging it does.
    pub fn resize(&self, rows: u16, cols: u16) {
        let size = winsize(rows, cols);
        // SAFETY: TIOCSWINSZ reads a winsize from the pointer given.
        let rc = unsafe { libc::ioctl(self.master.as_raw_fd(), libc::TIOCSWINSZ as _, &size) };
        assert_eq!(rc, 0, "TIOCSWINSZ: {}", std::io::Error::last_os_error());
    }

    /// Waits until the output holds `needle` after what earlier waits consumed; returns the
    /// output up to and including it, and consumes it.
    pub async fn wait_for(&mut self, needle: &str, timeout: Duration) -> String {
        match self.look_for(needle, timeout).await {
            Ok(upto) => upto,
            Err(why) => panic!("{why}"),
        }
    }

    /// [`Terminal::wait_for`], or None when `timeout` passes first (the output stays).
    pub async fn try_wait_for(&mut self, needle: &str, timeout: Duration) -> Option<String> {
        self.look_for(needle, timeout).await.ok()
    }

    async fn look_for(&mut self, needle: &str, timeout: Duration) -> Result<String, String> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(at) = self.seen.find(needle) {
                let rest = self.seen.split_off(at + needle.len());
                return Ok(std::mem::replace(&mut self.seen, rest));
            }
            match tokio::time::timeout_at(deadline, self.output.recv()).await {
                Ok(Some(bytes)) => self.seen.push_str(&String::from_utf8_lossy(&bytes)),
                Ok(None) => {
                    return Err(format!(
                        "the command closed its terminal before writing {needle:?}; it wrote {:?}",
                        self.seen
                    ))
                }
                Err(_) => {
                    return Err(format!(
                        "no {needle:?} on the terminal within {timeout:?}; it shows {:?}",
                        self.seen
                    ))
                }
            }
        }
    }

    /// Waits for the command to end; its exit status, and everything it wrote that no wait
    /// consumed.
    pub async fn wait_exit(&mut self, timeout: Duration) -> (std::process::ExitStatus, String) {
        let status = tokio::time::timeout(timeout, self.child.wait())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "the command did not end within {timeout:?}; it shows {:?}",
                    self.seen
                )
            })
            .expect("waiting for the command");
        // What it wrote last is read until the terminal closes (its children may hold it a
        // moment longer).
        let until = tokio::time::Instant::now() + Duration::from_secs(5);
        while let Ok(Some(bytes)) = tokio::time::timeout_at(until, self.output.recv()).await {
            self.seen.push_str(&String::from_utf8_lossy(&bytes));
        }
        (status, std::mem::take(&mut self.seen))
    }

    /// Ends the command (SIGKILL), as closing the terminal's window would.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }
}
