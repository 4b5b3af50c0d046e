//! `mesh report`'s page (issue 63) opened in a headless Chromium with no network: it opens, fetches nothing, draws its pictures, and its figures are those of `mesh status FARM --json`.

use std::path::Path;

use serde_json::Value;

use crate::browser::{self, Browser};

/// Opens `page` (written by `mesh report`) and checks it against `status`
/// (`mesh status FARM --json` of the same farm); skipped without a browser.
pub fn opens_and_says_what_status_says(page: &Path, status: &Value, shot: &str) {
    let Some((chromium, driver)) = browser::installed() else {
        return;
    };
    let url = format!("file://{}", page.display());
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(async {
            let b = Browser::start(&chromium, &driver).await;
            b.client.goto(&url).await.expect("the report opens");
            // Self-contained: no script, and nothing it loads from elsewhere.
            let outside = b
                .eval(
                    "return document.querySelectorAll('script, link, img, iframe, [src]').length;",
                )
                .await;
            assert_eq!(outside, 0, "the report loads nothing");
            let svgs = b
                .eval("return document.querySelectorAll('svg').length;")
                .await;
            assert!(
                svgs.as_u64().unwrap_or(0) >= 3,
                "a timeline and the distributions: {svgs}"
            );
            let summary = b
                .eval("return Object.assign({}, document.getElementById('summary').dataset);")
                .await;
            for k in ["total", "done", "failed"] {
                assert_eq!(
                    summary[k].as_str().and_then(|s| s.parse::<u64>().ok()),
                    status["counts"][k].as_u64(),
                    "{k}: the page {summary}, status {}",
                    status["counts"]
                );
            }
            let rows = b
                .eval(
                    "return [...document.querySelectorAll('#stages tr[data-stage]')]\
                     .map(r => Object.assign({}, r.dataset));",
                )
                .await;
            let rows = rows.as_array().expect("the stages' rows");
            let used = status["used"].as_array().expect("used per stage");
            assert_eq!(rows.len(), used.len(), "a row a measured stage: {rows:?}");
            for (row, u) in rows.iter().zip(used) {
                assert_eq!(row["stage"], u["stage"]);
                for (attr, key) in [
                    ("runs", "runs"),
                    ("runtimeP50Ms", "runtime_p50_ms"),
                    ("runtimeP90Ms", "runtime_p90_ms"),
                    ("peakP50", "peak_p50"),
                    ("peakMax", "peak_max"),
                    ("memAsked", "mem_asked"),
                    ("writtenBytes", "written_bytes"),
                    ("oom", "oom"),
                ] {
                    assert_eq!(
                        row[attr].as_str().and_then(|s| s.parse::<u64>().ok()),
                        u[key].as_u64(),
                        "{key} of {}: the page {row}, status {u}",
                        u["stage"]
                    );
                }
                let cpu: f64 = row["cpuPct"].as_str().and_then(|s| s.parse().ok()).unwrap();
                assert!(
                    (cpu - u["cpu_pct"].as_f64().unwrap()).abs() < 0.001,
                    "{row} {u}"
                );
            }
            let failures = b
                .eval("return document.querySelectorAll('#failures li').length;")
                .await;
            assert_eq!(
                failures.as_u64(),
                status["failures"].as_array().map(|f| f.len() as u64),
                "the failures"
            );
            let png = b.client.screenshot().await.expect("a screenshot");
            std::fs::write(browser::screenshots().join(shot), png).expect("save screenshot");
        });
}
