//! The page served at `/` when the editor bundle is not built (behind the token, like the
//! API): the workspace's graphs, run counts and the newest runs, and how to build the
//! editor.

use sluice_api::{RunRecord, RunStatus};

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Renders the page: every graph, the count of runs by status, and the runs given.
pub fn render(graphs: &[String], runs: &[RunRecord], counts: &[(RunStatus, u64)]) -> String {
    let counts: Vec<String> = counts.iter().map(|(s, n)| format!("{n} {s}")).collect();
    let counts = counts.join(", ");
    let graph_items: String = graphs
        .iter()
        .map(|g| format!("<li><a href=\"/api/graphs/{0}\">{0}</a></li>", escape(g)))
        .collect();
    let run_rows: String = runs
        .iter()
        .map(|r| {
            format!(
                "<tr><td><a href=\"/api/runs/{0}\">{0}</a></td><td>{1}</td><td>{2}</td><td>{3}</td></tr>",
                escape(&r.id),
                escape(&r.graph),
                r.status.as_str(),
                escape(r.error.as_deref().unwrap_or(""))
            )
        })
        .collect();
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>Sluice</title>
<style>body{{font-family:sans-serif;margin:2em}}td{{padding:0 1em}}</style></head><body>
<h1>Sluice</h1><p>The editor bundle is not built (run <code>cargo xtask editor</code>, then restart); the API is at <a href=\"/api/openapi.json\">/api/openapi.json</a>.</p>
<h2>Graphs</h2><ul>{graph_items}</ul>
<h2>Runs</h2><p>{counts}; the newest are listed (all: <a href=\"/api/runs\">/api/runs</a>).</p><table><tr><th>id</th><th>graph</th><th>status</th><th>error</th></tr>{run_rows}</table>
</body></html>"
    )
}
