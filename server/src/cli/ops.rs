//! `sluice ops`: the operator palette.

use anyhow::Result;
use std::process::ExitCode;

/// Runs the command.
pub fn ops(as_json: bool) -> Result<ExitCode> {
    let schemas = sluice_engine::ops::schemas();
    if as_json {
        println!("{}", serde_json::to_string_pretty(&schemas)?);
        return Ok(ExitCode::SUCCESS);
    }
    let mut family = "";
    for s in schemas {
        if s.family != family {
            family = s.family;
            println!("{family}:");
        }
        let attrs: Vec<String> = s
            .attrs
            .iter()
            .map(|a| match a.default {
                Some(d) => format!("{}={d}", a.name),
                None => a.name.to_string(),
            })
            .collect();
        println!("  {:<16} {}  [{}]", s.name, s.doc, attrs.join(", "));
    }
    Ok(ExitCode::SUCCESS)
}
