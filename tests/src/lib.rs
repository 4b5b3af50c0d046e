//! Support for mesh's end-to-end tests: a sandbox folder, running the real `mesh` binary with bounded waits, cleanup.

use std::fs;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// The longest any single mesh command may take in a test.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// A temporary folder with its own state folder, and the mesh binary under test.
pub struct Sandbox {
    dir: tempfile::TempDir,
    bin: PathBuf,
}

/// A finished mesh command.
#[derive(Debug)]
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}):\n{}\nstderr:\n{}",
                self.stdout, self.stderr
            )
        })
    }

    /// Panics with the output unless the exit code is `code`.
    #[track_caller]
    pub fn expect_code(&self, code: i32) -> &Run {
        assert_eq!(
            self.code,
            Some(code),
            "exit code {:?}, wanted {code}\nstdout:\n{}\nstderr:\n{}",
            self.code,
            self.stdout,
            self.stderr
        );
        self
    }
}

impl From<Output> for Run {
    fn from(o: Output) -> Run {
        Run {
            code: o.status.code(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

/// A mesh process started in the background; killed if the test forgets it.
pub struct Background {
    child: Option<Child>,
}

impl Background {
    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.as_ref().expect("child is live").id() as i32)
    }

    pub fn signal(&self, sig: Signal) {
        let _ = kill(self.pid(), sig);
    }

    /// Waits for the process to end (bounded) and returns its output.
    pub fn wait(mut self) -> Run {
        let mut child = self.child.take().expect("child is live");
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        loop {
            if child.try_wait().expect("try_wait").is_some() {
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("mesh did not exit within {COMMAND_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child.wait_with_output().expect("collect output").into()
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Sandbox {
    pub fn new(bin: &str) -> Sandbox {
        Sandbox {
            dir: tempfile::Builder::new()
                .prefix("mesh-e2e-")
                .tempdir()
                .expect("temp dir"),
            bin: PathBuf::from(bin),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// Writes a file (making folders); scripts ending in `.sh` are made executable.
    pub fn write(&self, rel: &str, content: &str) -> PathBuf {
        let p = self.dir.path().join(rel);
        if let Some(d) = p.parent() {
            fs::create_dir_all(d).expect("mkdir");
        }
        fs::write(&p, content).expect("write");
        if rel.ends_with(".sh") {
            fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        p
    }

    pub fn read(&self, rel: &str) -> String {
        let p = self.dir.path().join(rel);
        fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
    }

    pub fn exists(&self, rel: &str) -> bool {
        self.dir.path().join(rel).exists()
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.args(args)
            .current_dir(self.dir.path())
            .env("MESH_STATE_DIR", self.state())
            .env_remove("MESH_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// Runs mesh to completion (bounded by `COMMAND_TIMEOUT`).
    pub fn mesh(&self, args: &[&str]) -> Run {
        self.spawn(args).wait()
    }

    /// Starts mesh in the background.
    pub fn spawn(&self, args: &[&str]) -> Background {
        Background {
            child: Some(self.command(args).spawn().expect("start mesh")),
        }
    }

    /// Lines of a file, or none when it does not exist yet.
    pub fn lines(&self, rel: &str) -> Vec<String> {
        let mut s = String::new();
        if let Ok(mut f) = fs::File::open(self.dir.path().join(rel)) {
            let _ = f.read_to_string(&mut s);
        }
        s.lines().map(str::to_string).collect()
    }
}

/// Polls `cond` every 20 ms until it holds or `limit` passes; returns whether it held.
pub fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

/// True while a process with this pid exists.
pub fn alive(pid: i32) -> bool {
    kill(Pid::from_raw(pid), None).is_ok()
}
