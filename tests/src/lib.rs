//! Support for mesh's end-to-end tests: a sandbox folder, running the real `mesh` binary with bounded waits, cleanup.

use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

pub mod oracle;

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
    pub fn wait(self) -> Run {
        match self.wait_within(COMMAND_TIMEOUT) {
            Some(r) => r,
            None => panic!("mesh did not exit within {COMMAND_TIMEOUT:?}"),
        }
    }

    /// Waits at most `limit` for the process to end: its output, or none
    /// when it had to be killed.
    pub fn wait_within(mut self, limit: Duration) -> Option<Run> {
        let mut child = self.child.take().expect("child is live");
        // Drain the pipes while waiting: a command that prints more than a
        // pipe holds would otherwise block forever on a full pipe.
        let drain = |pipe: Option<Box<dyn Read + Send>>| {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                if let Some(mut p) = pipe {
                    let _ = p.read_to_end(&mut buf);
                }
                String::from_utf8_lossy(&buf).into_owned()
            })
        };
        let out = drain(
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        );
        let err = drain(
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        );
        // Waited for on a thread rather than polled, so the benchmarks that
        // time a command see when it exits, not the next poll.
        let pid = Pid::from_raw(child.id() as i32);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait());
        });
        let status = match rx.recv_timeout(limit) {
            Ok(s) => s.expect("wait for mesh"),
            Err(_) => {
                let _ = kill(pid, Signal::SIGKILL);
                return None;
            }
        };
        Some(Run {
            code: status.code(),
            stdout: out.join().expect("stdout reader"),
            stderr: err.join().expect("stderr reader"),
        })
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

    /// The file's text, or none when it does not exist.
    pub fn read_opt(&self, rel: &str) -> Option<String> {
        fs::read_to_string(self.dir.path().join(rel)).ok()
    }

    pub fn exists(&self, rel: &str) -> bool {
        self.dir.path().join(rel).exists()
    }

    fn command(&self, args: &[&str]) -> Command {
        mesh_command(&self.bin, args, self.dir.path(), &self.state())
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

    /// Runs mesh with its stdout a pipe nobody reads (as `mesh ... | head`
    /// once `head` has quit): the read end is closed before mesh starts,
    /// so its first write to stdout finds the reader gone.
    pub fn mesh_unread(&self, args: &[&str]) -> Run {
        unread(self.command(args))
    }

    /// Runs mesh as `mesh ARGS | head -n LINES` does: its first `lines`
    /// lines read, then the pipe's read end closed while mesh may still be
    /// writing. Those lines, and how mesh ended (its stdout empty).
    pub fn mesh_head(&self, args: &[&str], lines: usize) -> (Vec<String>, Run) {
        let mut child = self.command(args).spawn().expect("start mesh");
        let out = child.stdout.take().expect("piped");
        let head = BufReader::new(out)
            .lines()
            .take(lines)
            .map(|l| l.expect("a line of mesh's output"))
            .collect();
        // The reader is dropped here, as `head` exits: the read end closes.
        let run = Background { child: Some(child) }.wait();
        (head, run)
    }

    /// Starts mesh in the background with these variables in its environment.
    pub fn spawn_env(&self, args: &[&str], env: &[(&str, &str)]) -> Background {
        let mut c = self.command(args);
        c.envs(env.iter().copied());
        Background {
            child: Some(c.spawn().expect("start mesh")),
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

/// `mesh ARGS` run in `cwd` on state folder `state`, its output piped,
/// with none of the variables a developer's shell may have set for mesh
/// (log level, a remote mesh and its key) leaking into the test.
fn mesh_command(bin: &Path, args: &[&str], cwd: &Path, state: &Path) -> Command {
    let mut c = Command::new(bin);
    c.args(args)
        .current_dir(cwd)
        .env("MESH_STATE_DIR", state)
        .env_remove("MESH_LOG")
        .env_remove("MESH_ADDR")
        .env_remove("MESH_KEY")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// `python -m snakemake` in `dir`, with this repository's plugin and
/// Python client on its path and `mesh` the binary they run (`python`: a
/// Python with Snakemake installed).
pub fn snakemake(python: &std::ffi::OsStr, dir: &Path, mesh: &str) -> Command {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut c = Command::new(python);
    c.args(["-m", "snakemake"])
        .current_dir(dir)
        .env(
            "PYTHONPATH",
            format!(
                "{}:{}",
                repo.join("snakemake-executor-plugin-mesh").display(),
                repo.join("python").display()
            ),
        )
        .env("MESH_BIN", mesh);
    c
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

/// A `mesh node` (or `mesh join`) process whose stdout lines are collected as they come.
pub struct NodeProc {
    child: Option<Child>,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    pub state: PathBuf,
}

impl NodeProc {
    /// Starts `mesh <args>` with state folder `state`.
    pub fn start(bin: &Path, cwd: &Path, state: &Path, args: &[&str]) -> NodeProc {
        NodeProc::start_with(bin, cwd, state, args, &[])
    }

    /// As [`NodeProc::start`], with more environment.
    pub fn start_with(
        bin: &Path,
        cwd: &Path,
        state: &Path,
        args: &[&str],
        env: &[(String, String)],
    ) -> NodeProc {
        let mut child = mesh_command(bin, args, cwd, state)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .spawn()
            .expect("start mesh node");
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        for pipe in [
            Box::new(child.stdout.take().expect("stdout")) as Box<dyn Read + Send>,
            Box::new(child.stderr.take().expect("stderr")),
        ] {
            let lines = lines.clone();
            std::thread::spawn(move || {
                use std::io::BufRead;
                for l in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
                    lines.lock().expect("lines").push(l);
                }
            });
        }
        NodeProc {
            child: Some(child),
            lines,
            state: state.to_path_buf(),
        }
    }

    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().expect("lines").clone()
    }

    /// The first address the node printed (`mesh node <id> listening on <addr>`), waiting for it.
    pub fn address(&self) -> String {
        let mut found = None;
        let ok = wait_until(Duration::from_secs(30), || {
            found = self
                .lines()
                .iter()
                .find_map(|l| l.split(" listening on ").nth(1).map(str::to_string));
            found.is_some()
        });
        assert!(ok, "node printed no address:\n{}", self.lines().join("\n"));
        found.expect("found")
    }

    /// The node's peer id, as it printed it.
    pub fn peer_id(&self) -> String {
        self.address();
        self.lines()
            .iter()
            .find_map(|l| {
                l.strip_prefix("mesh node ")
                    .and_then(|r| r.split(' ').next())
                    .map(str::to_string)
            })
            .expect("printed its id")
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.as_ref().expect("live").id() as i32)
    }

    pub fn signal(&self, sig: Signal) {
        let _ = kill(self.pid(), sig);
    }

    /// Waits (bounded) for the process to exit; its exit code.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<i32> {
        let child = self.child.as_mut().expect("live");
        let deadline = Instant::now() + limit;
        loop {
            if let Some(s) = child.try_wait().expect("try_wait") {
                return s.code();
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // Stop it the way a user would, so its tasks are stopped too; then make sure.
            let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Several mesh nodes sharing one mesh key, in one sandbox: on 127.0.0.1,
/// or each in a network namespace of a [`NetPair`].
pub struct Cluster {
    pub nodes: Vec<NodeProc>,
    bin: PathBuf,
    root: PathBuf,
    /// Per node: the namespace it runs in (none: this one) and where it listens.
    places: Vec<(Option<String>, String)>,
    /// Set in every node's environment (a batch system's settings).
    pub env: Vec<(String, String)>,
    /// Folders nodes other than the first do not see (see [`Cluster::start_apart`]).
    hidden: Vec<PathBuf>,
}

/// Whether nodes can be started each in a mount namespace of its own
/// (`unshare -m`, as root): machines that share no file system.
pub fn apart_possible() -> bool {
    nix::unistd::geteuid().is_root()
        && which("unshare").is_some()
        && Command::new("unshare")
            .args(["-m", "sh", "-c", "mount -t tmpfs tmpfs /mnt"])
            .status()
            .is_ok_and(|s| s.success())
}

/// How long [`Cluster::start_many`] (and a test starting a mesh of hundreds
/// its own way) waits for every node to see every other.
pub const START_MANY_WAIT_S: u64 = 420;

impl Cluster {
    /// Starts `resources.len()` nodes: the first with `mesh node`, the others
    /// joining it; `resources[i]` is node i's `--resources` (empty: detected).
    /// Returns once every node sees all the others.
    pub fn start(sandbox: &Sandbox, resources: &[&str], extra: &[&str]) -> Cluster {
        Cluster::start_placed(sandbox, resources, extra, &[])
    }

    /// As [`Cluster::start`], node `i` running in namespace `places[i].0`
    /// and listening on `places[i].1` (past the end of `places`: loopback).
    pub fn start_placed(
        sandbox: &Sandbox,
        resources: &[&str],
        extra: &[&str],
        places: &[(Option<String>, String)],
    ) -> Cluster {
        Cluster::start_in(sandbox, resources, extra, places, Vec::new(), Vec::new())
    }

    /// As [`Cluster::start`], every node but the first in a mount namespace
    /// of its own where each of `hidden` is an empty tmpfs: the submitter's
    /// farm and output folders are on its machine only, as on a cluster
    /// with no shared file system. Needs [`apart_possible`].
    pub fn start_apart(
        sandbox: &Sandbox,
        resources: &[&str],
        extra: &[&str],
        hidden: &[&Path],
    ) -> Cluster {
        for h in hidden {
            fs::create_dir_all(h).expect("mkdir");
        }
        let hidden = hidden.iter().map(|h| h.to_path_buf()).collect();
        Cluster::start_in(sandbox, resources, extra, &[], Vec::new(), hidden)
    }

    /// As [`Cluster::start`], with `env` in every node's environment.
    pub fn start_with_env(
        sandbox: &Sandbox,
        resources: &[&str],
        extra: &[&str],
        env: Vec<(String, String)>,
    ) -> Cluster {
        Cluster::start_in(sandbox, resources, extra, &[], env, Vec::new())
    }

    fn start_in(
        sandbox: &Sandbox,
        resources: &[&str],
        extra: &[&str],
        places: &[(Option<String>, String)],
        env: Vec<(String, String)>,
        hidden: Vec<PathBuf>,
    ) -> Cluster {
        let root = sandbox.path().to_path_buf();
        let bin = sandbox.bin.clone();
        let first = root.join("n0");
        let init = Command::new(&bin)
            .args(["--state-dir", &first.to_string_lossy(), "init"])
            .output()
            .expect("mesh init");
        assert!(init.status.success(), "mesh init failed: {init:?}");
        let places = (0..resources.len())
            .map(|i| {
                places
                    .get(i)
                    .cloned()
                    .unwrap_or((None, "/ip4/127.0.0.1/tcp/0".into()))
            })
            .collect();
        let mut c = Cluster {
            nodes: Vec::new(),
            bin,
            root,
            places,
            env,
            hidden,
        };
        for (i, r) in resources.iter().enumerate() {
            let state = c.root.join(format!("n{i}"));
            if i > 0 {
                fs::create_dir_all(&state).expect("mkdir");
                let key = state.join("mesh.key");
                fs::copy(first.join("mesh.key"), &key).expect("copy key");
                fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).expect("chmod");
            }
            let join = if i > 0 {
                Some(c.nodes[0].address())
            } else {
                None
            };
            c.add(&state, join.as_deref(), r, extra);
        }
        let n = resources.len();
        let ok = wait_until(Duration::from_secs(30), || {
            (0..n).all(|i| c.status(i)["nodes"].as_array().map_or(0, |a| a.len()) == n)
        });
        assert!(ok, "the nodes did not all see each other: {}", c.status(0));
        c
    }

    /// Starts `n` nodes of `resources`, the first with `mesh node` and the
    /// others joining it, all launched at once as a batch system starts
    /// them; returns once the coordinator hears every node (its `mesh
    /// status`, one request a look): one mesh, ready for a farm. Whether
    /// each node has also heard of every other (its `joined` lines, see
    /// [`sees`]) is for the tests of membership to ask.
    pub fn start_many(sandbox: &Sandbox, n: usize, resources: &str, extra: &[&str]) -> Cluster {
        let mut c = Cluster::start_in(sandbox, &[resources], extra, &[], Vec::new(), Vec::new());
        let addr = c.nodes[0].address();
        for _ in 1..n {
            c.add_joiner(Some(&addr), resources, extra);
        }
        // Debug builds of 300 nodes on two cores: most runs are done in one
        // to two minutes, a loaded one has taken more than three.
        let mut heard = 0;
        let ok = wait_until(Duration::from_secs(START_MANY_WAIT_S), || {
            heard = c.status(0)["nodes"].as_array().map_or(0, |a| a.len());
            if heard < n {
                std::thread::sleep(Duration::from_secs(1));
            }
            heard >= n
        });
        let how: Vec<String> = c
            .nodes
            .iter()
            .take(3)
            .enumerate()
            .map(|(i, nd)| {
                let lines = nd.lines();
                format!(
                    "node {i} sees {}, follows {:?}; its last lines:\n{}",
                    sees(&lines),
                    follows(&lines),
                    lines[lines.len().saturating_sub(8)..].join("\n")
                )
            })
            .collect();
        assert!(
            ok,
            "the coordinator hears {heard} of {n} nodes after {START_MANY_WAIT_S} s\n{}",
            how.join("\n")
        );
        c
    }

    /// Starts one more node on 127.0.0.1, with a state folder of its own
    /// and the mesh's key: joining `join`, or alone (`mesh node`).
    pub fn add_joiner(&mut self, join: Option<&str>, resources: &str, extra: &[&str]) {
        let i = self.nodes.len();
        let state = self.root.join(format!("n{i}"));
        fs::create_dir_all(&state).expect("mkdir");
        let key = state.join("mesh.key");
        fs::copy(self.root.join("n0").join("mesh.key"), &key).expect("copy key");
        fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).expect("chmod");
        self.places.push((None, "/ip4/127.0.0.1/tcp/0".into()));
        self.add(&state, join, resources, extra);
    }

    /// Starts one more node with this state folder.
    pub fn add(&mut self, state: &Path, join: Option<&str>, resources: &str, extra: &[&str]) {
        let cmd = match join {
            Some(a) => vec!["join", a],
            None => vec!["node"],
        };
        let node = self.spawn_node(self.nodes.len(), state, &cmd, resources, extra);
        self.nodes.push(node);
    }

    /// Starts `mesh <cmd>` for node `i` where that node lives.
    fn spawn_node(
        &self,
        i: usize,
        state: &Path,
        cmd: &[&str],
        resources: &str,
        extra: &[&str],
    ) -> NodeProc {
        let (ns, listen) = self
            .places
            .get(i)
            .cloned()
            .unwrap_or((None, "/ip4/127.0.0.1/tcp/0".into()));
        let bin = self.bin.to_string_lossy().into_owned();
        let mut args: Vec<&str> = Vec::new();
        if let Some(ns) = &ns {
            args.extend(["netns", "exec", ns, &bin]);
        }
        args.extend(cmd);
        args.extend(["--listen", &listen]);
        if !resources.is_empty() {
            args.extend(["--resources", resources]);
        }
        args.extend(extra);
        let mut exe = if ns.is_some() {
            PathBuf::from("ip")
        } else {
            self.bin.clone()
        };
        let mounts: String = self
            .hidden
            .iter()
            .map(|h| format!("mount -t tmpfs tmpfs '{}' && ", h.display()))
            .collect();
        let script = format!("{mounts}exec \"$0\" \"$@\"");
        let exe_text = exe.to_string_lossy().into_owned();
        if i > 0 && !self.hidden.is_empty() {
            // `sh -c SCRIPT EXE ARGS...`: the node is exec'd in the new
            // namespace, keeping its pid, once the folders are hidden.
            let mut wrapped = vec!["-m", "sh", "-c", &script, &exe_text];
            wrapped.extend(args);
            args = wrapped;
            exe = PathBuf::from("unshare");
        }
        let node = NodeProc::start_with(&exe, &self.root, state, &args, &self.env);
        node.address();
        node
    }

    /// SIGKILLs node `i` and waits for it to be gone.
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].signal(Signal::SIGKILL);
        let _ = self.nodes[i].wait_exit(Duration::from_secs(10));
    }

    /// Starts node `i` again on its state folder with `mesh node` (it
    /// rejoins the peers it knew), with these `--resources` and flags.
    /// It listens where it did before, as a node of a real mesh would
    /// (`--listen` with a fixed port): that is where its peers look for it.
    pub fn restart(&mut self, i: usize, resources: &str, extra: &[&str]) {
        let state = self.nodes[i].state.clone();
        let was = self.nodes[i].address();
        if let Some(place) = self.places.get_mut(i) {
            place.1 = was;
        }
        self.nodes[i] = self.spawn_node(i, &state, &["node"], resources, extra);
    }

    /// `mesh status --json` as node `i` answers it.
    pub fn status(&self, i: usize) -> serde_json::Value {
        let r = self.mesh(i, &["status", "--json"]);
        serde_json::from_str(&r.stdout).unwrap_or(serde_json::Value::Null)
    }

    /// Node `i` as it describes itself in `mesh status --json` (queued,
    /// running, prefetch, ...); null when it does not answer.
    pub fn own_status(&self, i: usize) -> serde_json::Value {
        let s = self.status(i);
        s["nodes"]
            .as_array()
            .and_then(|n| n.iter().find(|n| n["local"] == true))
            .cloned()
            .unwrap_or(serde_json::Value::Null)
    }

    /// Runs a mesh command against node `i`'s state folder.
    pub fn mesh(&self, i: usize, args: &[&str]) -> Run {
        self.mesh_start(i, args).wait()
    }

    /// One control request (a JSON line, see docs/api.md) to node `i`,
    /// through `mesh control-pipe` as the Python client sends it: its
    /// answers, a JSON value each.
    pub fn control(&self, i: usize, request: &serde_json::Value) -> Vec<serde_json::Value> {
        use std::io::Write as _;
        let mut child = mesh_command(
            &self.bin,
            &["control-pipe"],
            &self.root,
            &self.nodes[i].state,
        )
        .stdin(Stdio::piped())
        .spawn()
        .expect("start mesh control-pipe");
        let mut stdin = child.stdin.take().expect("piped");
        writeln!(stdin, "{request}").expect("write the request");
        drop(stdin);
        let run = Background { child: Some(child) }.wait();
        run.stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }

    /// Starts a mesh command against node `i`'s state folder.
    pub fn mesh_start(&self, i: usize, args: &[&str]) -> Background {
        let child = mesh_command(&self.bin, args, &self.root, &self.nodes[i].state)
            .spawn()
            .expect("start mesh");
        Background { child: Some(child) }
    }

    /// As [`Sandbox::mesh_unread`], against node `i`'s state folder.
    pub fn mesh_unread(&self, i: usize, args: &[&str]) -> Run {
        unread(mesh_command(
            &self.bin,
            args,
            &self.root,
            &self.nodes[i].state,
        ))
    }
}

/// Runs `c` (bounded) with its stdout a pipe whose reader is already gone.
fn unread(mut c: Command) -> Run {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    c.stdout(Stdio::from(writer));
    Background {
        child: Some(c.spawn().expect("start mesh")),
    }
    .wait()
}

/// How many other nodes a node's output says it sees now: those it said
/// `mesh node … joined` of, less those it said are gone since.
pub fn sees<S: AsRef<str>>(lines: &[S]) -> usize {
    let mut up = std::collections::HashSet::new();
    for l in lines {
        let Some(rest) = l.as_ref().split("mesh node ").nth(1) else {
            continue;
        };
        let label = rest.split(' ').next().unwrap_or("");
        if rest.contains(" joined") {
            up.insert(label.to_string());
        } else if rest.contains(" is gone") {
            up.remove(label);
        }
    }
    up.len()
}

/// Listens on the TCP port of `addr` (as a node printed it) until dropped:
/// a node restarted meanwhile cannot have its old port back.
pub fn hold_port(addr: &str) -> std::net::TcpListener {
    let port = addr
        .split("/tcp/")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .and_then(|p| p.parse::<u16>().ok())
        .expect("an address with a TCP port");
    std::net::TcpListener::bind(("127.0.0.1", port)).expect("the old port is free")
}

/// Whether the nodes whose `mesh status --json` answers are `statuses` are
/// one mesh of `n`: each answered, each follows the same coordinator, and
/// that coordinator hears `n` nodes. Asked of the nodes, not read from
/// what they printed: a node restored from its store may follow its old
/// coordinator without a line saying so.
pub fn one_mesh_of(statuses: &[serde_json::Value], n: usize) -> bool {
    let Some(c) = statuses.first().and_then(|s| s["coordinator"].as_str()) else {
        return false;
    };
    statuses.iter().all(|s| {
        s["coordinator"].as_str() == Some(c) && s["nodes"].as_array().is_some_and(|a| a.len() >= n)
    })
}

/// What each status says, for a failure's message: whom it follows and
/// how many nodes its coordinator hears.
pub fn describe_statuses(statuses: &[serde_json::Value]) -> String {
    statuses
        .iter()
        .enumerate()
        .map(|(i, s)| {
            format!(
                "node {i}: follows {}, its coordinator hears {} nodes",
                s["coordinator"],
                s["nodes"].as_array().map_or(0, Vec::len)
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whom a node's output says it follows now: the peer id of its last
/// `coordinator is …` line.
pub fn follows<S: AsRef<str>>(lines: &[S]) -> Option<String> {
    lines
        .iter()
        .rev()
        .find_map(|l| l.as_ref().strip_prefix("coordinator is "))
        .and_then(|r| r.split(' ').next())
        .map(str::to_string)
}

impl Drop for Cluster {
    /// Asks every node to stop at once, so they stop together rather than
    /// one after the other as each `NodeProc` is dropped and waited for.
    fn drop(&mut self) {
        for n in &self.nodes {
            if n.child.is_some() {
                n.signal(Signal::SIGTERM);
            }
        }
    }
}

/// A farm of `n` tasks of `secs` seconds, each writing its index to `r.txt`
/// in its own folder (an output the farm's home must get back).
pub fn slow_farm(n: u32, secs: &str) -> String {
    format!(
        r#"
[farm]
name = "slow"

[[stage]]
name = "s"
sweep.i = {{ range = "0..{}" }}
workdir = "w/{{i}}"
shell = 'sleep {secs}; echo {{i}} > r.txt'
outputs = ["r.txt"]
"#,
        n - 1
    )
}

/// Asserts that every output of a `slow_farm` of `n` tasks is home under
/// `dir` (the farm's `--out`), each the task's own.
pub fn assert_outputs_home(sb: &Sandbox, dir: &str, n: u32) {
    let missing: Vec<u32> = (0..n)
        .filter(|i| sb.read_opt(&format!("{dir}/s/{i}/r.txt")) != Some(format!("{i}\n")))
        .collect();
    assert!(
        missing.is_empty(),
        "outputs missing or wrong for tasks {missing:?}"
    );
}

/// 20 tasks of 0.5 s and 180 of 0.01 s: 11.8 s of work.
pub const IMBALANCED: &str = r#"
[farm]
name = "imbalanced"

[[stage]]
name = "long"
sweep.i = { range = "0..19" }
command = ["sleep", "0.5"]

[[stage]]
name = "short"
sweep.i = { range = "0..179" }
command = ["sleep", "0.01"]
"#;

/// Runs the imbalanced farm on 4 nodes of 2 slots where the coordinator
/// hands every task to one node (a huge prefetch); returns the seconds from
/// submit to done. The lower bound is 11.8 s / 8 slots = 1.475 s.
pub fn imbalanced_makespan(sb: &Sandbox, steal: bool) -> f64 {
    let mut flags = vec!["--prefetch-percent", "100000000", "--claims-max", "100000"];
    if !steal {
        flags.push("--no-steal");
    }
    let c = Cluster::start(sb, &["cpu=2"; 4], &flags);
    sb.write("farm.toml", IMBALANCED);
    let start = std::time::Instant::now();
    let r = c.mesh(0, &["submit", "farm.toml", "--wait", "--json"]);
    let took = start.elapsed().as_secs_f64();
    r.expect_code(0);
    took
}

/// Two network namespaces joined by a veth pair (10.231.<k>.1 and .2), for
/// partition tests: [`NetPair::cut`] takes the link down, [`NetPair::heal`]
/// brings it back. Removed on drop. Needs root and `ip`.
pub struct NetPair {
    pub ns: [String; 2],
    pub addr: [String; 2],
    link: String,
}

impl NetPair {
    /// Makes the pair, or says why it cannot be made here.
    pub fn create() -> Result<NetPair, String> {
        let id = std::process::id() % 100_000;
        let k = id % 250 + 1;
        let p = NetPair {
            ns: [format!("mesh{id}a"), format!("mesh{id}b")],
            addr: [format!("10.231.{k}.1"), format!("10.231.{k}.2")],
            link: format!("mv{id}"),
        };
        let (a, b) = (&p.ns[0], &p.ns[1]);
        let (la, lb) = (format!("{}a", p.link), format!("{}b", p.link));
        let (ea, eb) = (&p.addr[0], &p.addr[1]);
        let steps = [
            format!("netns add {a}"),
            format!("netns add {b}"),
            format!("link add {la} type veth peer name {lb}"),
            format!("link set {la} netns {a}"),
            format!("link set {lb} netns {b}"),
            format!("-n {a} addr add {ea}/24 dev {la}"),
            format!("-n {b} addr add {eb}/24 dev {lb}"),
            format!("-n {a} link set lo up"),
            format!("-n {b} link set lo up"),
            format!("-n {a} link set {la} up"),
            format!("-n {b} link set {lb} up"),
        ];
        let steps = steps.map(|s| s.split(' ').map(String::from).collect::<Vec<_>>());
        for s in steps {
            ip(&s)?;
        }
        Ok(p)
    }

    /// Takes the link down: neither side reaches the other.
    pub fn cut(&self) {
        self.link_state("down");
    }

    pub fn heal(&self) {
        self.link_state("up");
    }

    fn link_state(&self, state: &str) {
        let args = [
            "-n".into(),
            self.ns[0].clone(),
            "link".into(),
            "set".into(),
            format!("{}a", self.link),
            state.into(),
        ];
        ip(&args).expect("set the link");
    }
}

impl Drop for NetPair {
    fn drop(&mut self) {
        for ns in &self.ns {
            let _ = ip(&["netns".into(), "del".into(), ns.clone()]);
        }
    }
}

fn ip(args: &[String]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A one-node SLURM cluster of this machine (Debian's `slurm-wlm` with
/// `munge`), with its own configuration, state and ports, for as long as
/// the value lives. Needs root.
pub struct Slurm {
    pub conf: PathBuf,
    dir: PathBuf,
    daemons: Vec<Child>,
    /// munged was started here, and is stopped with the cluster.
    own_munge: bool,
}

impl Slurm {
    /// Starts munged (when not running), slurmctld and slurmd, and waits
    /// for the node to be idle; says why when it cannot.
    pub fn start(dir: &Path) -> Result<Slurm, String> {
        for bin in ["munged", "slurmctld", "slurmd", "sbatch", "sinfo"] {
            if which(bin).is_none() {
                return Err(format!(
                    "{bin} not found (Debian: apt-get install slurm-wlm munge)"
                ));
            }
        }
        if !nix::unistd::geteuid().is_root() {
            return Err("the SLURM daemons need root".into());
        }
        let munge_running = Command::new("pgrep")
            .arg("-x")
            .arg("munged")
            .output()
            .is_ok_and(|o| o.status.success());
        if !munge_running {
            let _ = fs::create_dir_all("/run/munge");
            let _ = Command::new("chown")
                .args(["munge:munge", "/run/munge"])
                .status();
            // Its output must not hold the test's pipes open once it daemonizes.
            let ok = Command::new("runuser")
                .args(["-u", "munge", "--", "munged"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                return Err("munged did not start".into());
            }
        }
        let host = nix::unistd::gethostname()
            .map_err(|e| format!("hostname: {e}"))?
            .to_string_lossy()
            .into_owned();
        let free_port = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .map_err(|e| format!("no free port: {e}"))
        };
        let (ctld, slurmd) = (free_port()?, free_port()?);
        let d = dir.to_path_buf();
        for sub in ["state", "spool", "log"] {
            fs::create_dir_all(d.join(sub)).map_err(|e| e.to_string())?;
        }
        let p = |s: &str| d.join(s).to_string_lossy().into_owned();
        let conf = d.join("slurm.conf");
        fs::write(
            &conf,
            format!(
                "ClusterName=meshtest\nSlurmctldHost={host}(127.0.0.1)\nSlurmctldPort={ctld}\n\
                 SlurmdPort={slurmd}\nAuthType=auth/munge\nSlurmUser=root\nSlurmdUser=root\n\
                 StateSaveLocation={}\nSlurmdSpoolDir={}\nSlurmctldPidFile={}\nSlurmdPidFile={}\n\
                 SlurmctldLogFile={}\nSlurmdLogFile={}\nProctrackType=proctrack/linuxproc\n\
                 TaskPlugin=task/none\nSelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n\
                 ReturnToService=2\nMpiDefault=none\n\
                 NodeName={host} NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN\n\
                 PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP\n",
                p("state"),
                p("spool"),
                p("ctld.pid"),
                p("d.pid"),
                p("log/ctld.log"),
                p("log/d.log"),
            ),
        )
        .map_err(|e| e.to_string())?;
        let mut s = Slurm {
            conf: conf.clone(),
            dir: d,
            daemons: Vec::new(),
            own_munge: !munge_running,
        };
        for daemon in ["slurmctld", "slurmd"] {
            let child = Command::new(daemon)
                .arg("-D")
                .env("SLURM_CONF", &conf)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("{daemon}: {e}"))?;
            s.daemons.push(child);
        }
        let idle = wait_until(Duration::from_secs(30), || {
            s.command("sinfo")
                .args(["--noheader", "--format=%t"])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "idle")
        });
        if !idle {
            let log = fs::read_to_string(s.dir.join("log/ctld.log")).unwrap_or_default();
            return Err(format!("the SLURM node did not come up:\n{log}"));
        }
        Ok(s)
    }

    /// A SLURM command (`sbatch`, `squeue`, ...) talking to this cluster.
    pub fn command(&self, bin: &str) -> Command {
        let mut c = Command::new(bin);
        c.env("SLURM_CONF", &self.conf);
        c
    }

    /// The states `squeue` shows, as it prints them (`1 RUNNING`).
    pub fn queue(&self) -> String {
        self.command("squeue")
            .args(["--noheader", "--format=%i %T"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        let _ = self.command("scancel").arg("--user=root").status();
        for d in &mut self.daemons {
            let _ = d.kill();
            let _ = d.wait();
        }
        if self.own_munge {
            let _ = Command::new("pkill").args(["-x", "munged"]).status();
            // Gone before the next cluster looks for it: one found still
            // exiting is not started again, and the next cluster has none.
            wait_until(Duration::from_secs(10), || {
                !Command::new("pgrep")
                    .args(["-x", "munged"])
                    .output()
                    .is_ok_and(|o| o.status.success())
            });
        }
    }
}

/// Where PATH finds a program, if it does.
pub fn which(bin: &str) -> Option<PathBuf> {
    which::which(bin).ok()
}
