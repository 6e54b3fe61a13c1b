//! The page served at `/` when the editor bundle is not built: the workspace's graphs and
//! runs, and how to build the editor.

use sluice_api::RunRecord;

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Renders the page.
pub fn render(graphs: &[String], runs: &[RunRecord]) -> String {
    let graph_items: String = graphs
        .iter()
        .map(|g| format!("<li><a href=\"/api/graphs/{0}\">{0}</a></li>", escape(g)))
        .collect();
    let run_rows: String = runs
        .iter()
        .take(100)
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
<h2>Runs</h2><table><tr><th>id</th><th>graph</th><th>status</th><th>error</th></tr>{run_rows}</table>
</body></html>"
    )
}
