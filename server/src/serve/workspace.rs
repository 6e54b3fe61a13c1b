//! The workspace folder, and the only code that turns names into paths in it:
//! `graphs/NAME.json` (with `graphs/NAME.safetensors`, the weights of a graph imported
//! from an ONNX model, which its `params.file` names); `versions/NAME/MILLIS.json`, the
//! last [`KEPT_VERSIONS`] versions a save or a delete replaced (restorable); per run `runs/ID/` with its kept request files (`graph.json` for an
//! inline graph, `inputs/K.npy` for uploads), its outputs (`FILE.npy`) and its events
//! (`events.json`, replayed to late watchers and made into its trace); `sluice.db`; and
//! `.lock`, held by the one server using the workspace. Graph names and output file names
//! are checked against a safe pattern and run ids against the server's own form here,
//! whatever the caller checked. Every file is written durably: a unique temp file in the
//! same folder, fsync, rename, fsync of the folder — a crash leaves the old bytes or the
//! new ones, never a mix.

use crate::files::{read_bounded, read_text_bounded, sync_dir, write_durably};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use sluice_api::{valid_name, GraphVersion as Version};
use sluice_engine::telemetry::Event;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

/// The examples copied into a new workspace.
const EXAMPLES: &[(&str, &str)] = &[
    ("mlp", include_str!("../../../assets/graphs/mlp.json")),
    ("cnn", include_str!("../../../assets/graphs/cnn.json")),
    (
        "transformer_block",
        include_str!("../../../assets/graphs/transformer_block.json"),
    ),
];

/// Earlier versions kept per graph: each save or delete that replaces a stored graph
/// keeps what it replaced, the oldest beyond this many dropped.
pub const KEPT_VERSIONS: usize = 10;

/// Largest graph file read from the workspace (a graph is stored only after its body
/// passed `--body-limit`; this bounds files put there by hand).
const MAX_GRAPH_FILE: u64 = 64 << 20;
/// Largest weights file read from the workspace (and so the largest model's weights the
/// server runs; each tensor is also bounded by the worker frame limit when sent).
pub const MAX_WEIGHTS_FILE: u64 = 2 << 30;
/// Largest events file replayed or made into a trace.
const MAX_EVENTS_FILE: u64 = 256 << 20;
/// Most events kept per run (the rest are counted): about 30 MB of JSON.
pub const MAX_KEPT_EVENTS: usize = 200_000;
/// Largest kept upload read back (uploads arrive in bodies under `--body-limit`).
const MAX_KEPT_FILE: u64 = 4 << 30;

/// Whether a graph's `params.file` names a weights file the server keeps: `NAME.safetensors`
/// with a valid graph name, in the graphs folder.
pub fn valid_weights_file(file: &str) -> bool {
    file.strip_suffix(".safetensors").is_some_and(valid_name)
}

/// The weights file of the graph `name`.
pub fn weights_file(name: &str) -> String {
    format!("{name}.safetensors")
}

/// Whether a string is a run id as the server makes them: 16 lowercase hex digits.
pub fn valid_run_id(id: &str) -> bool {
    id.len() == 16 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A workspace folder.
#[derive(Debug, Clone)]
pub struct Workspace {
    root: PathBuf,
}

/// The lock on a workspace: held (an `flock` on `.lock`, which names the holder's process
/// id) as long as this value lives; the kernel releases it when the process dies.
#[derive(Debug)]
pub struct WorkspaceLock {
    _file: File,
}

/// Takes the workspace's lock, or fails naming the process that holds it.
#[cfg(unix)]
fn lock(root: &Path) -> Result<WorkspaceLock> {
    use std::os::unix::io::AsRawFd;
    let path = root.join(".lock");
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    // SAFETY: flock on a descriptor this function owns.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let mut holder = String::new();
        let _ = file.take(64).read_to_string(&mut holder);
        bail!(
            "the workspace {} is in use by another sluice serve (process {}); stop it or choose another --workspace",
            root.display(),
            match holder.trim() {
                "" => "unknown",
                pid => pid,
            }
        );
    }
    file.set_len(0)?;
    file.rewind()?;
    writeln!(file, "{}", std::process::id())?;
    file.sync_all()?;
    Ok(WorkspaceLock { _file: file })
}

/// Takes the workspace's lock, or fails (elsewhere than Unix, without naming the holder).
#[cfg(not(unix))]
fn lock(root: &Path) -> Result<WorkspaceLock> {
    let path = root.join(".lock");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    if file.try_lock().is_err() {
        bail!(
            "the workspace {} is in use by another sluice serve; stop it or choose another --workspace",
            root.display()
        );
    }
    Ok(WorkspaceLock { _file: file })
}

/// Creates a folder and makes its entry in the parent durable.
/// Held while a stored graph is replaced or deleted: the version kept and the write are
/// one step, so concurrent saves of one graph keep every version they replace.
fn replacing() -> std::sync::MutexGuard<'static, ()> {
    static REPLACING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    REPLACING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn create_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    if let Some(parent) = dir.parent() {
        sync_dir(parent)?;
    }
    Ok(())
}

impl Workspace {
    /// Opens (creating when needed) a workspace and takes its lock, before changing
    /// anything in it; a new workspace gets the examples, and temp files a killed server
    /// left are removed.
    pub fn open(root: &Path) -> Result<(Workspace, WorkspaceLock)> {
        std::fs::create_dir_all(root)
            .with_context(|| format!("cannot create {}", root.display()))?;
        let held = lock(root)?;
        let graphs = root.join("graphs");
        let fresh = !graphs.exists();
        create_dir(&graphs)?;
        create_dir(&root.join("runs"))?;
        let ws = Workspace {
            root: root.to_path_buf(),
        };
        if fresh {
            for (name, text) in EXAMPLES {
                ws.write_graph(name, text.as_bytes())?;
            }
        }
        for entry in std::fs::read_dir(&graphs)?.filter_map(|e| e.ok()) {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') && name.ends_with(".tmp") {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        Ok((ws, held))
    }

    /// The database file.
    pub fn db_path(&self) -> PathBuf {
        self.root.join("sluice.db")
    }

    fn graphs(&self) -> PathBuf {
        self.root.join("graphs")
    }

    fn graph_file(name: &str) -> Result<String> {
        if !valid_name(name) {
            bail!("'{name}' is not a valid graph name");
        }
        Ok(format!("{name}.json"))
    }

    /// Names of the stored graphs, sorted.
    pub fn list_graphs(&self) -> Result<Vec<String>> {
        let mut names: Vec<String> = std::fs::read_dir(self.graphs())
            .with_context(|| format!("cannot list {}", self.graphs().display()))?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                e.file_name()
                    .to_str()
                    .and_then(|n| n.strip_suffix(".json"))
                    .map(str::to_string)
            })
            .filter(|n| valid_name(n))
            .collect();
        names.sort();
        Ok(names)
    }

    /// A stored graph's text, if it exists.
    pub fn read_graph(&self, name: &str) -> Result<Option<String>> {
        let p = self.graphs().join(Workspace::graph_file(name)?);
        match read_text_bounded(&p, MAX_GRAPH_FILE) {
            Ok(t) => Ok(Some(t)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("cannot read {}", p.display())),
        }
    }

    /// Stores a graph durably, keeping the version it replaces.
    pub fn write_graph(&self, name: &str, bytes: &[u8]) -> Result<()> {
        let _one_at_a_time = replacing();
        self.keep_version(name)?;
        write_durably(&self.graphs(), &Workspace::graph_file(name)?, bytes)
    }

    fn versions(&self, name: &str) -> Result<PathBuf> {
        Workspace::graph_file(name)?;
        Ok(self.root.join("versions").join(name))
    }

    /// Copies the stored graph `name` (if any) into its versions, then drops the oldest
    /// beyond [`KEPT_VERSIONS`].
    fn keep_version(&self, name: &str) -> Result<()> {
        let Some(text) = self.read_graph(name)? else {
            return Ok(());
        };
        let dir = self.versions(name)?;
        create_dir(&dir)?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let newest = self
            .list_versions(name)?
            .first()
            .and_then(|v| v.version.parse().ok());
        let id = newest.map_or(now, |n: u64| now.max(n.saturating_add(1)));
        write_durably(&dir, &format!("{id}.json"), text.as_bytes())?;
        for old in self.list_versions(name)?.iter().skip(KEPT_VERSIONS) {
            match std::fs::remove_file(dir.join(format!("{}.json", old.version))) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!("cannot drop version {} of '{name}'", old.version)
                    })
                }
            }
        }
        sync_dir(&dir)
    }

    /// The kept versions of graph `name`, newest first.
    pub fn list_versions(&self, name: &str) -> Result<Vec<Version>> {
        let dir = self.versions(name)?;
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e).with_context(|| format!("cannot list {}", dir.display())),
        };
        let mut out: Vec<(u64, Version)> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let file = e.file_name().to_str()?.to_string();
                let id: u64 = file.strip_suffix(".json")?.parse().ok()?;
                let bytes = e.metadata().ok()?.len();
                Some((
                    id,
                    Version {
                        version: id.to_string(),
                        bytes,
                    },
                ))
            })
            .collect();
        out.sort_by_key(|v| std::cmp::Reverse(v.0));
        Ok(out.into_iter().map(|(_, v)| v).collect())
    }

    /// A kept version's text, if it exists (`version` as [`list_versions`] gives it).
    ///
    /// [`list_versions`]: Workspace::list_versions
    pub fn read_version(&self, name: &str, version: &str) -> Result<Option<String>> {
        if version.is_empty() || version.len() > 20 || !version.bytes().all(|b| b.is_ascii_digit())
        {
            bail!("'{version}' is not a version id");
        }
        let p = self.versions(name)?.join(format!("{version}.json"));
        match read_text_bounded(&p, MAX_GRAPH_FILE) {
            Ok(t) => Ok(Some(t)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("cannot read {}", p.display())),
        }
    }

    /// Stores a weights file durably (`NAME.safetensors`, [`valid_weights_file`]).
    pub fn write_weights(&self, file: &str, bytes: &[u8]) -> Result<()> {
        if !valid_weights_file(file) {
            bail!("'{file}' is not a weights file of the workspace");
        }
        write_durably(&self.graphs(), file, bytes)
    }

    /// Stores an imported graph and its weights durably: the weights file (which the graph
    /// names) first, then the graph, so the graph never names weights not yet written.
    pub fn write_model(&self, name: &str, graph: &[u8], weights: &[u8]) -> Result<()> {
        Workspace::graph_file(name)?;
        write_durably(&self.graphs(), &weights_file(name), weights)?;
        self.write_graph(name, graph)
    }

    /// A weights file's bytes (at most [`MAX_WEIGHTS_FILE`]), if it exists.
    pub fn read_weights(&self, file: &str) -> Result<Option<Vec<u8>>> {
        if !valid_weights_file(file) {
            bail!("'{file}' is not a weights file of the workspace");
        }
        let p = self.graphs().join(file);
        match read_bounded(&p, MAX_WEIGHTS_FILE) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("cannot read the weights file '{file}'")),
        }
    }

    /// Whether a weights file exists as a regular file of at most [`MAX_WEIGHTS_FILE`].
    pub fn has_weights(&self, file: &str) -> Result<bool> {
        if !valid_weights_file(file) {
            bail!("'{file}' is not a weights file of the workspace");
        }
        match std::fs::metadata(self.graphs().join(file)) {
            Ok(m) => Ok(m.is_file() && m.len() <= MAX_WEIGHTS_FILE),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e).with_context(|| format!("cannot read the weights file '{file}'")),
        }
    }

    /// Whether a stored graph names `file` as its weights (`params.file`). A graph that
    /// cannot be read or parsed counts as naming it: keeping a file is always safe.
    fn weights_in_use(&self, file: &str) -> Result<bool> {
        for graph in self.list_graphs()? {
            let named = match self.read_graph(&graph) {
                Ok(Some(text)) => serde_json::from_str::<serde_json::Value>(&text)
                    .map_or(true, |doc| doc["params"]["file"].as_str() == Some(file)),
                Ok(None) => false,
                Err(_) => true,
            };
            if named {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Deletes a graph (kept among its versions, so it can be restored) and its weights
    /// file (`NAME.safetensors`, if any, unless another graph still names it: one saved
    /// under a new name keeps the imported weights); false if the graph did not exist.
    pub fn delete_graph(&self, name: &str) -> Result<bool> {
        let _one_at_a_time = replacing();
        self.keep_version(name)?;
        let deleted = match std::fs::remove_file(self.graphs().join(Workspace::graph_file(name)?)) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(e).context("cannot delete the graph"),
        };
        if self.weights_in_use(&weights_file(name))? {
            sync_dir(&self.graphs())?;
            return Ok(deleted);
        }
        match std::fs::remove_file(self.graphs().join(weights_file(name))) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).context("cannot delete the graph's weights"),
        }
        sync_dir(&self.graphs())?;
        Ok(deleted)
    }

    /// A run's folder.
    fn run_dir(&self, id: &str) -> Result<PathBuf> {
        if !valid_run_id(id) {
            bail!("'{id}' is not a run id");
        }
        Ok(self.root.join("runs").join(id))
    }

    /// Keeps what a run request carried as files of the run: an inline graph as
    /// `graph.json`, uploads as `inputs/K.npy` in the order given.
    pub fn keep_request(&self, id: &str, graph: Option<&[u8]>, uploads: &[Vec<u8>]) -> Result<()> {
        let dir = self.run_dir(id)?;
        create_dir(&dir)?;
        if let Some(text) = graph {
            write_durably(&dir, "graph.json", text)?;
        }
        if !uploads.is_empty() {
            let inputs = dir.join("inputs");
            create_dir(&inputs)?;
            for (k, bytes) in uploads.iter().enumerate() {
                write_durably(&inputs, &format!("{k}.npy"), bytes)?;
            }
        }
        Ok(())
    }

    /// A run's kept inline graph.
    pub fn kept_graph(&self, id: &str) -> Result<String> {
        let p = self.run_dir(id)?.join("graph.json");
        read_text_bounded(&p, MAX_GRAPH_FILE)
            .with_context(|| format!("cannot read {}", p.display()))
    }

    /// A run's kept upload number `k`.
    pub fn kept_input(&self, id: &str, k: usize) -> Result<Vec<u8>> {
        let p = self.run_dir(id)?.join("inputs").join(format!("{k}.npy"));
        read_bounded(&p, MAX_KEPT_FILE).with_context(|| format!("cannot read {}", p.display()))
    }

    /// Writes a run's output as `FILE.npy` (the file name must be a valid name).
    pub fn write_output(&self, id: &str, file: &str, bytes: &[u8]) -> Result<()> {
        if !valid_name(file) {
            bail!("'{file}' is not a valid output file name");
        }
        let dir = self.run_dir(id)?;
        create_dir(&dir)?;
        write_durably(&dir, &format!("{file}.npy"), bytes)
    }

    /// Opens a run's output `FILE.npy` with its size; None when there is none.
    pub fn open_output(&self, id: &str, file: &str) -> Result<Option<(File, u64)>> {
        if !valid_name(file) {
            return Ok(None);
        }
        let p = self.run_dir(id)?.join(format!("{file}.npy"));
        match File::open(&p).and_then(|f| Ok((f.metadata()?, f))) {
            Ok((meta, f)) if meta.is_file() => Ok(Some((f, meta.len()))),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("cannot open {}", p.display())),
        }
    }

    /// Keeps a finished run's events (at most [`MAX_KEPT_EVENTS`], the rest counted) and
    /// device names as `events.json`.
    pub fn write_run_events(&self, id: &str, events: &[Event], devices: &[String]) -> Result<()> {
        let kept = &events[..events.len().min(MAX_KEPT_EVENTS)];
        let text = serde_json::to_vec(&RunEvents {
            events: kept.to_vec(),
            devices: devices.to_vec(),
            dropped: events.len() - kept.len(),
        })?;
        let dir = self.run_dir(id)?;
        create_dir(&dir)?;
        write_durably(&dir, "events.json", &text)
    }

    /// A finished run's events and device names (None for runs that kept none: failed
    /// runs, and runs of older servers).
    pub fn read_run_events(&self, id: &str) -> Result<Option<RunEvents>> {
        let p = self.run_dir(id)?.join("events.json");
        match read_bounded(&p, MAX_EVENTS_FILE) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .with_context(|| format!("{} is damaged", p.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("cannot read {}", p.display())),
        }
    }

    /// Removes a run's folder and everything in it.
    pub fn remove_run(&self, id: &str) -> Result<()> {
        let dir = self.run_dir(id)?;
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e).with_context(|| format!("cannot remove {}", dir.display())),
        }
    }

    /// The ids of the run folders present.
    pub fn run_ids(&self) -> Result<Vec<String>> {
        let runs = self.root.join("runs");
        Ok(std::fs::read_dir(&runs)
            .with_context(|| format!("cannot list {}", runs.display()))?
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .filter(|id| valid_run_id(id))
            .collect())
    }
}

/// What `runs/ID/events.json` holds.
#[derive(Debug, Serialize, Deserialize)]
pub struct RunEvents {
    /// The run's events, up to [`MAX_KEPT_EVENTS`].
    pub events: Vec<Event>,
    /// Name of each device, by index.
    pub devices: Vec<String>,
    /// Events not kept.
    #[serde(default)]
    pub dropped: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("sluice-ws-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_second_opener_is_refused_naming_the_holder() {
        let root = temp("lock");
        let (_ws, held) = Workspace::open(&root).unwrap();
        let e = Workspace::open(&root).unwrap_err().to_string();
        assert!(
            e.contains(&format!(
                "in use by another sluice serve (process {})",
                std::process::id()
            )),
            "{e}"
        );
        drop(held);
        assert!(Workspace::open(&root).is_ok());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn replaced_and_deleted_graphs_are_kept_as_versions_up_to_the_limit() {
        let root = temp("versions");
        let (ws, _held) = Workspace::open(&root).unwrap();
        assert!(ws.list_versions("g").unwrap().is_empty());
        ws.write_graph("g", b"{\"v\": 0}").unwrap();
        assert!(
            ws.list_versions("g").unwrap().is_empty(),
            "nothing was replaced"
        );
        for v in 1..=KEPT_VERSIONS + 2 {
            ws.write_graph("g", format!("{{\"v\": {v}}}").as_bytes())
                .unwrap();
        }
        let versions = ws.list_versions("g").unwrap();
        assert_eq!(versions.len(), KEPT_VERSIONS);
        // Newest first: the one the last save replaced.
        let newest = ws.read_version("g", &versions[0].version).unwrap().unwrap();
        assert_eq!(newest, format!("{{\"v\": {}}}", KEPT_VERSIONS + 1));
        let oldest = ws
            .read_version("g", &versions[KEPT_VERSIONS - 1].version)
            .unwrap();
        assert_eq!(oldest.unwrap(), "{\"v\": 2}");
        // A delete keeps the deleted graph.
        assert!(ws.delete_graph("g").unwrap());
        let after = ws.list_versions("g").unwrap();
        let kept = ws.read_version("g", &after[0].version).unwrap().unwrap();
        assert_eq!(kept, format!("{{\"v\": {}}}", KEPT_VERSIONS + 2));
        // Hostile ids and names.
        for bad in ["", "../g", "1.json", "12a", "123456789012345678901"] {
            assert!(ws.read_version("g", bad).is_err(), "{bad}");
        }
        assert!(ws.read_version("g", "1").unwrap().is_none());
        assert!(ws.list_versions("../x").is_err());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_model_is_stored_with_its_weights_and_deleted_with_them() {
        let root = temp("model");
        let (ws, _held) = Workspace::open(&root).unwrap();
        ws.write_model("m", b"{}", b"weights").unwrap();
        assert_eq!(ws.read_graph("m").unwrap().as_deref(), Some("{}"));
        assert_eq!(
            ws.read_weights("m.safetensors").unwrap().unwrap(),
            b"weights"
        );
        assert!(ws.has_weights("m.safetensors").unwrap());
        assert!(ws.list_graphs().unwrap().contains(&"m".to_string()));
        assert!(ws.delete_graph("m").unwrap());
        assert!(ws.read_weights("m.safetensors").unwrap().is_none());
        assert!(!ws.has_weights("m.safetensors").unwrap());
        assert!(!ws.delete_graph("m").unwrap());
        // A graph saved under another name that still reads the weights keeps them.
        ws.write_model("m", b"{}", b"weights").unwrap();
        let copy = br#"{"format": "sluice/graph@1", "params": {"file": "m.safetensors"}}"#;
        ws.write_graph("copy", copy).unwrap();
        assert!(ws.delete_graph("m").unwrap());
        assert!(
            ws.has_weights("m.safetensors").unwrap(),
            "'copy' still names them"
        );
        // A graph that cannot be parsed might name them too: they stay.
        ws.write_graph("copy", b"{ not json").unwrap();
        ws.write_model("m", b"{}", b"weights").unwrap();
        assert!(ws.delete_graph("m").unwrap());
        assert!(ws.has_weights("m.safetensors").unwrap());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn names_that_are_not_the_servers_own_never_become_paths() {
        let root = temp("names");
        let (ws, _held) = Workspace::open(&root).unwrap();
        for bad in ["../x", "", "a/b", ".hidden", "x.json"] {
            assert!(ws.write_graph(bad, b"{}").is_err(), "{bad}");
            assert!(ws.read_graph(bad).is_err(), "{bad}");
            assert!(ws.write_model(bad, b"{}", b"").is_err(), "{bad}");
        }
        for bad in [
            "../x.safetensors",
            "x",
            "/etc/x.safetensors",
            ".safetensors",
            "a/b.safetensors",
            "x.json",
        ] {
            assert!(!valid_weights_file(bad), "{bad}");
            assert!(ws.read_weights(bad).is_err(), "{bad}");
            assert!(ws.has_weights(bad).is_err(), "{bad}");
        }
        assert!(valid_weights_file(&weights_file("m-1")));
        for bad in ["../../../../tmp", "0123456789ABCDEF", "0123"] {
            assert!(ws.keep_request(bad, Some(b"{}"), &[]).is_err(), "{bad}");
            assert!(ws.write_output(bad, "y", b"").is_err(), "{bad}");
        }
        assert!(ws.write_output("0123456789abcdef", "../y", b"").is_err());
        assert!(ws
            .open_output("0123456789abcdef", "../y")
            .unwrap()
            .is_none());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn concurrent_writers_of_one_graph_leave_one_whole_file_and_no_temp() {
        let root = temp("concurrent");
        let (ws, _held) = Workspace::open(&root).unwrap();
        let bodies: Vec<Vec<u8>> = (0..8u8).map(|i| vec![b'a' + i; 100_000]).collect();
        std::thread::scope(|s| {
            for b in &bodies {
                let ws = ws.clone();
                s.spawn(move || {
                    for _ in 0..10 {
                        ws.write_graph("g", b).unwrap();
                    }
                });
            }
        });
        let got = ws.read_graph("g").unwrap().unwrap().into_bytes();
        assert!(bodies.contains(&got), "a mix of writers");
        let leftovers: Vec<_> = std::fs::read_dir(root.join("graphs"))
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty());
        let _ = std::fs::remove_dir_all(&root);
    }
}
