//! A headless Chromium driven through chromedriver, for the dashboard's page tests (the end-to-end binary's and the big meshes').

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use mesh_tests::which;
use serde_json::{json, Value};

/// Kills a child (and waits for it) when dropped.
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A browser session: its client, and the chromedriver behind it.
pub struct Browser {
    pub client: Client,
    _driver: Reaped,
}

/// Chromium and chromedriver, when installed; `None` (the test says it
/// is skipped) where they are not and `MESH_REQUIRE_BROWSER` is unset.
pub fn installed() -> Option<(PathBuf, PathBuf)> {
    match (which("chromium"), which("chromedriver")) {
        (Some(c), Some(d)) => Some((c, d)),
        _ => {
            assert!(
                std::env::var_os("MESH_REQUIRE_BROWSER").is_none(),
                "MESH_REQUIRE_BROWSER is set and chromium or chromedriver is missing"
            );
            eprintln!(
                "SKIPPED: the browser test needs chromium and chromedriver \
                 (Debian: apt-get install chromium chromium-driver); .ci/run installs them"
            );
            None
        }
    }
}

impl Browser {
    /// Starts chromedriver and a headless session of `chromium`.
    pub async fn start(chromium: &Path, driver: &Path) -> Browser {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let driver = Reaped(
            Command::new(driver)
                .arg(format!("--port={port}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start chromedriver"),
        );
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": chromium,
                "args": ["--headless", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1280,900"],
            }),
        );
        let webdriver = format!("http://127.0.0.1:{port}");
        let start = Instant::now();
        loop {
            match ClientBuilder::new(HttpConnector::new())
                .capabilities(caps.clone())
                .connect(&webdriver)
                .await
            {
                Ok(client) => {
                    return Browser {
                        client,
                        _driver: driver,
                    }
                }
                Err(e) if start.elapsed() > Duration::from_secs(30) => {
                    panic!("chromedriver started no session: {e}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// A number the page keeps in `document.body.dataset`.
    pub async fn body_data(&self, key: &str) -> Option<u64> {
        let v = self
            .client
            .execute(
                "return document.body.dataset[arguments[0]] || null;",
                vec![json!(key)],
            )
            .await
            .ok()?;
        v.as_str().and_then(|s| s.parse().ok())
    }

    /// Loads `url` and waits for its first render; how long that took (ms).
    pub async fn open(&self, url: &str) -> u64 {
        self.client.goto(url).await.expect("the page loads");
        let start = Instant::now();
        loop {
            if let Some(ms) = self.body_data("firstRenderMs").await {
                return ms;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the page never rendered"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The size in bytes of one update as the page fetches it (`/api/status`).
    pub async fn update_bytes(&self) -> Value {
        self.client
            .execute_async(
                "fetch('/api/status').then(r => r.text()).then(t => arguments[0](t.length));",
                vec![],
            )
            .await
            .expect("the page fetches its data")
    }

    /// Runs `script` in the page and returns what it returns.
    pub async fn eval(&self, script: &str) -> Value {
        self.client
            .execute(script, vec![])
            .await
            .expect("the page answers")
    }

    /// At `w`x`h`, saves a screenshot of `view` as `dir/NAME-VIEW-W.png`
    /// and checks the page is no wider than the window (a table may
    /// scroll inside its own box, the page may not).
    pub async fn shot_fits(
        &self,
        url: &str,
        view: &str,
        (w, h): (u32, u32),
        dir: &Path,
        name: &str,
    ) {
        self.client
            .set_window_size(w, h)
            .await
            .expect("the window resizes");
        self.client
            .goto(&format!("{url}#{view}"))
            .await
            .expect("the view loads");
        let start = Instant::now();
        while self.body_data("updates").await.unwrap_or(0) == 0
            && start.elapsed() < Duration::from_secs(10)
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // What the page fetches after an update (the node table) comes too.
        tokio::time::sleep(Duration::from_millis(400)).await;
        let png = self.client.screenshot().await.expect("a screenshot");
        std::fs::write(dir.join(format!("{name}{view}-{w}.png")), png).expect("save screenshot");
        let over = self
            .eval(
                "const e = document.documentElement; \
                 return [e.scrollWidth, e.clientWidth, window.innerWidth];",
            )
            .await;
        let (scroll, client) = (over[0].as_u64(), over[1].as_u64());
        assert!(
            scroll.is_some() && scroll <= client,
            "{view} at {w}x{h}: the page is wider than the window \
             (scrollWidth, clientWidth, innerWidth: {over})"
        );
    }
}

/// Where page tests leave their screenshots.
pub fn screenshots() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/dashboard-screenshots");
    std::fs::create_dir_all(&dir).expect("screenshot folder");
    dir
}

/// The address a node printed for its dashboard.
pub fn dashboard_url(lines: &[String]) -> Option<String> {
    lines
        .iter()
        .find_map(|l| l.strip_prefix("dashboard: ").map(str::to_string))
}
