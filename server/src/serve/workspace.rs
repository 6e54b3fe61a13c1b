//! The workspace folder, and the only code that turns names into paths in it:
//! `graphs/NAME.json` (a stored graph); its weights, which its `params.file` names: a
//! model's weights stored with it as one commit, `graphs/NAME.HASH.safetensors` (HASH
//! naming the bytes, so such a file never changes), or a weights file put by name,
//! `graphs/NAME.safetensors`; `versions/NAME/ID.json` with `versions/NAME/ID.safetensors`,
//! the last [`KEPT_VERSIONS`] versions a save, a delete or a weights upload replaced,
//! each with the weights its graph named (restorable together); per run `runs/ID/` with
//! its kept request files (`graph.json` for an inline graph, `inputs/K.npy` for uploads),
//! its outputs (`FILE.npy`) and its events (`events.json`, replayed to late watchers and
//! made into its trace); `sluice.db`; and `.lock`, held by the one server using the
//! workspace. Graph names and output file names are checked against a safe pattern and
//! run ids against the server's own form here, whatever the caller checked. Every file is
//! written durably: a unique temp file in the same folder, fsync, rename, fsync of the
//! folder — a crash leaves the old bytes or the new ones, never a mix.
//!
//! A graph and its weights are one commit: the weights file is written first and never
//! changes afterwards; renaming the graph file into place commits both, so a reader that
//! reads a graph and then the weights it names (a run, the editor, a crash) always gets
//! that model's weights, never another's. Every change of the stored graphs, weights and
//! versions happens under one lock.

use crate::files::{read_bounded, read_text_bounded, sync_dir, write_durably};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use sluice_api::{valid_name, GraphVersion as Version};
use sluice_engine::telemetry::Event;
use std::collections::HashSet;
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

/// Hex digits of the content hash in a committed weights file's name (128 bits of
/// SHA-256).
const HASH_DIGITS: usize = 32;

/// Whether a graph's `params.file` names a weights file the server keeps, in the graphs
/// folder: `NAME.safetensors` ([`weights_file`]) or `NAME.HASH.safetensors`
/// ([`committed_weights_file`]), NAME a valid graph name.
pub fn valid_weights_file(file: &str) -> bool {
    settable_weights_file(file) || committed_file(file)
}

/// Whether `file` is a weights file put by name (`NAME.safetensors`), which
/// `PUT /api/weights` may replace.
pub fn settable_weights_file(file: &str) -> bool {
    file.strip_suffix(".safetensors").is_some_and(valid_name)
}

/// Whether `file` is a model's committed weights (`NAME.HASH.safetensors`), which never
/// change.
fn committed_file(file: &str) -> bool {
    file.strip_suffix(".safetensors")
        .and_then(|stem| stem.rsplit_once('.'))
        .is_some_and(|(name, hash)| {
            valid_name(name)
                && hash.len() == HASH_DIGITS
                && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        })
}

/// The weights file the graph `name` may be given by name (`PUT /api/weights`).
pub fn weights_file(name: &str) -> String {
    format!("{name}.safetensors")
}

/// The file a model's weights are committed as with the graph `name`:
/// `NAME.HASH.safetensors`, HASH the first 128 bits of the bytes' SHA-256 in hex, so
/// different weights never share a file and a committed file never changes.
pub fn committed_weights_file(name: &str, weights: &[u8]) -> String {
    format!("{name}.{}.safetensors", content_hash(weights))
}

/// The first 128 bits of the SHA-256 of `bytes`, in lowercase hex (the digest of the
/// TLS stack the server already links, *ring*).
fn content_hash(bytes: &[u8]) -> String {
    use rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256;
    use std::fmt::Write as _;
    let sha256 = match TLS13_AES_128_GCM_SHA256 {
        rustls::SupportedCipherSuite::Tls13(suite) => suite.common.hash_provider,
        rustls::SupportedCipherSuite::Tls12(suite) => suite.common.hash_provider,
    };
    let digest = sha256.hash(bytes);
    digest
        .as_ref()
        .iter()
        .take(HASH_DIGITS / 2)
        .fold(String::new(), |mut hex, b| {
            let _ = write!(hex, "{b:02x}");
            hex
        })
}

/// The weights file a graph's text names in `params.file`, when it is one of the
/// workspace's; `Err` when the text is not a JSON document.
fn named_file(text: &str) -> Result<Option<String>, ()> {
    let doc: serde_json::Value = serde_json::from_str(text).map_err(|_| ())?;
    Ok(doc["params"]["file"]
        .as_str()
        .filter(|f| valid_weights_file(f))
        .map(str::to_string))
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

/// Held while the stored graphs, weights or versions change: a version kept and the
/// change it keeps it for are one step, and a graph and its weights one commit, so
/// concurrent saves of one graph keep every version they replace and never leave one
/// model's graph with another's weights.
fn changing() -> std::sync::MutexGuard<'static, ()> {
    static CHANGING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    CHANGING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Creates a folder and makes its entry in the parent durable.
fn create_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    if let Some(parent) = dir.parent() {
        sync_dir(parent)?;
    }
    Ok(())
}

/// Removes a file; one already gone is fine.
fn remove_if_present(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("cannot remove {}", path.display())),
    }
}

/// Whether `path` is a regular file (not a link, folder or device).
fn is_regular(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file())
}

/// Makes `to` hold the bytes of `from`, a weights file that is never written in place
/// (every write renames a new file over the name): a hard link, or a durable copy where
/// the file system has none. The caller makes the folder's entry durable.
fn keep_file(from: &Path, to: &Path) -> Result<()> {
    remove_if_present(to)?;
    if std::fs::hard_link(from, to).is_ok() {
        return Ok(());
    }
    let bytes = read_bounded(from, MAX_WEIGHTS_FILE)
        .with_context(|| format!("cannot read {}", from.display()))?;
    let (dir, name) = match (to.parent(), to.file_name().and_then(|n| n.to_str())) {
        (Some(dir), Some(name)) => (dir, name),
        _ => bail!("cannot keep weights as {}", to.display()),
    };
    write_durably(dir, name, &bytes)
}

/// A version id as [`Workspace::list_versions`] gives them: up to 20 digits.
fn check_version_id(version: &str) -> Result<()> {
    if version.is_empty() || version.len() > 20 || !version.bytes().all(|b| b.is_ascii_digit()) {
        bail!("'{version}' is not a version id");
    }
    Ok(())
}

/// A graph's text with its `params.file` naming `file` instead.
fn naming_weights(text: &str, file: &str) -> Result<Vec<u8>> {
    let mut doc: serde_json::Value =
        serde_json::from_str(text).context("a kept version is not a JSON document")?;
    let Some(params) = doc
        .get_mut("params")
        .and_then(serde_json::Value::as_object_mut)
    else {
        bail!("a kept version names its weights outside 'params'");
    };
    params.insert("file".into(), serde_json::Value::String(file.to_string()));
    Ok(serde_json::to_vec_pretty(&doc)?)
}

/// The weights files the stored graphs name.
#[derive(Debug, Default)]
struct Named {
    files: HashSet<String>,
    /// Some graph could not be read or parsed, and so might name any file.
    unreadable: bool,
}

impl Named {
    /// Whether a stored graph names (or might name) `file`: keeping a file is always safe.
    fn includes(&self, file: &str) -> bool {
        self.unreadable || self.files.contains(file)
    }
}

impl Workspace {
    /// Opens (creating when needed) a workspace and takes its lock, before changing
    /// anything in it; a new workspace gets the examples, and temp files and committed
    /// weights no graph names (a killed server's leftovers) are removed.
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
        ws.drop_unnamed_commits()?;
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

    /// Stores a graph durably, keeping the version it replaces (with its weights).
    pub fn write_graph(&self, name: &str, bytes: &[u8]) -> Result<()> {
        let _one_at_a_time = changing();
        self.commit(name, bytes)
    }

    /// Stores an imported model as one commit: its weights as
    /// [`committed_weights_file`] (written first and durably, never changed afterwards),
    /// then its graph, which must name that file. What it replaces is kept as a version,
    /// with its weights.
    pub fn write_model(&self, name: &str, graph: &[u8], weights: &[u8]) -> Result<()> {
        Workspace::graph_file(name)?;
        let file = committed_weights_file(name, weights);
        let text = std::str::from_utf8(graph).context("a graph is UTF-8 text")?;
        if named_file(text) != Ok(Some(file.clone())) {
            bail!("the model's graph does not name its weights file '{file}'");
        }
        let _one_at_a_time = changing();
        if !is_regular(&self.graphs().join(&file)) {
            write_durably(&self.graphs(), &file, weights)?;
        }
        self.commit(name, graph)
    }

    /// Keeps the stored graph `name` as a version, renames `graph` into its place (the
    /// commit), then drops the committed weights the replaced graph named when no stored
    /// graph names them any more (its version keeps them). Called under [`changing`].
    fn commit(&self, name: &str, graph: &[u8]) -> Result<()> {
        let replaced = self.keep_version(name)?;
        write_durably(&self.graphs(), &Workspace::graph_file(name)?, graph)?;
        let still_named = std::str::from_utf8(graph)
            .ok()
            .and_then(|t| named_file(t).ok().flatten());
        match replaced {
            Some(file) if still_named.as_ref() != Some(&file) => self.drop_if_unnamed(&file),
            _ => Ok(()),
        }
    }

    /// The weights files the stored graphs name.
    fn named(&self) -> Result<Named> {
        let mut named = Named::default();
        for graph in self.list_graphs()? {
            match self.read_graph(&graph).map(|t| t.map(|t| named_file(&t))) {
                Ok(Some(Ok(Some(file)))) => {
                    named.files.insert(file);
                }
                Ok(None | Some(Ok(None))) => {}
                Ok(Some(Err(()))) | Err(_) => named.unreadable = true,
            }
        }
        Ok(named)
    }

    /// Drops the committed weights file `file` when no stored graph names it.
    fn drop_if_unnamed(&self, file: &str) -> Result<()> {
        if !committed_file(file) || self.named()?.includes(file) {
            return Ok(());
        }
        remove_if_present(&self.graphs().join(file))?;
        sync_dir(&self.graphs())
    }

    /// Drops every committed weights file no stored graph names: what a crash left
    /// between writing a model's weights and committing its graph, or between a commit
    /// and dropping what it replaced.
    fn drop_unnamed_commits(&self) -> Result<()> {
        let named = self.named()?;
        let dir = self.graphs();
        for entry in std::fs::read_dir(&dir)
            .with_context(|| format!("cannot list {}", dir.display()))?
            .filter_map(|e| e.ok())
        {
            let file = entry.file_name();
            let Some(file) = file.to_str() else { continue };
            if committed_file(file) && !named.includes(file) {
                remove_if_present(&entry.path())?;
            }
        }
        sync_dir(&dir)
    }

    fn versions(&self, name: &str) -> Result<PathBuf> {
        Workspace::graph_file(name)?;
        Ok(self.root.join("versions").join(name))
    }

    /// Keeps the stored graph `name` (if any) as a version together with the weights
    /// file it names (`ID.safetensors` beside `ID.json`), then drops the oldest beyond
    /// [`KEPT_VERSIONS`]. Returns the weights file the kept graph names. Called under
    /// [`changing`].
    fn keep_version(&self, name: &str) -> Result<Option<String>> {
        let Some(text) = self.read_graph(name)? else {
            return Ok(None);
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
        let file = named_file(&text).ok().flatten();
        if let Some(file) = &file {
            let weights = self.graphs().join(file);
            if is_regular(&weights) {
                // The weights first: a listed version always has them.
                keep_file(&weights, &dir.join(format!("{id}.safetensors")))?;
            }
        }
        write_durably(&dir, &format!("{id}.json"), text.as_bytes())?;
        let kept: HashSet<String> = self
            .list_versions(name)?
            .into_iter()
            .take(KEPT_VERSIONS)
            .map(|v| v.version)
            .collect();
        for entry in std::fs::read_dir(&dir)
            .with_context(|| format!("cannot list {}", dir.display()))?
            .filter_map(|e| e.ok())
        {
            let file = entry.file_name();
            let Some(file) = file.to_str() else { continue };
            let Some(version) = file
                .strip_suffix(".json")
                .or_else(|| file.strip_suffix(".safetensors"))
            else {
                continue;
            };
            if !version.bytes().all(|b| b.is_ascii_digit()) || kept.contains(version) {
                continue;
            }
            remove_if_present(&entry.path())
                .with_context(|| format!("cannot drop version {version} of '{name}'"))?;
        }
        sync_dir(&dir)?;
        Ok(file)
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
        check_version_id(version)?;
        let p = self.versions(name)?.join(format!("{version}.json"));
        match read_text_bounded(&p, MAX_GRAPH_FILE) {
            Ok(t) => Ok(Some(t)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("cannot read {}", p.display())),
        }
    }

    /// Makes a kept version the stored graph again together with the weights kept with
    /// it, as one commit (what it replaces is kept in turn); false when there is no such
    /// version. A version whose graph named weights put by name (`NAME.safetensors`,
    /// which a later upload may have replaced) comes back with its kept weights
    /// committed as [`committed_weights_file`], which its `params.file` then names.
    pub fn restore_version(&self, name: &str, version: &str) -> Result<bool> {
        let _one_at_a_time = changing();
        let Some(text) = self.read_version(name, version)? else {
            return Ok(false);
        };
        let kept = self.versions(name)?.join(format!("{version}.safetensors"));
        let graph = match named_file(&text) {
            Ok(Some(file)) if is_regular(&kept) => {
                if committed_file(&file) {
                    self.restore_weights(&kept, &file)?;
                    text.into_bytes()
                } else {
                    let bytes = read_bounded(&kept, MAX_WEIGHTS_FILE)
                        .with_context(|| format!("cannot read {}", kept.display()))?;
                    let committed = committed_weights_file(name, &bytes);
                    self.restore_weights(&kept, &committed)?;
                    naming_weights(&text, &committed)?
                }
            }
            _ => text.into_bytes(),
        };
        self.commit(name, &graph)?;
        Ok(true)
    }

    /// Puts kept weights back as the committed file `file` (unless it is there: a
    /// committed file never changes), durably.
    fn restore_weights(&self, kept: &Path, file: &str) -> Result<()> {
        let to = self.graphs().join(file);
        if is_regular(&to) {
            return Ok(());
        }
        keep_file(kept, &to)?;
        sync_dir(&self.graphs())
    }

    /// Stores a weights file put by name (`NAME.safetensors`, [`settable_weights_file`])
    /// durably; every stored graph naming the file it replaces keeps a version first,
    /// with the replaced weights.
    pub fn write_weights(&self, file: &str, bytes: &[u8]) -> Result<()> {
        if !settable_weights_file(file) {
            bail!("'{file}' is not a weights file that can be put (NAME.safetensors)");
        }
        let _one_at_a_time = changing();
        if is_regular(&self.graphs().join(file)) {
            for graph in self.list_graphs()? {
                let text = self.read_graph(&graph).ok().flatten();
                if text.is_some_and(|t| named_file(&t) == Ok(Some(file.to_string()))) {
                    self.keep_version(&graph)?;
                }
            }
        }
        write_durably(&self.graphs(), file, bytes)
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

    /// Deletes a graph (kept among its versions with its weights, so it can be restored)
    /// and its weights — the committed file it names and `NAME.safetensors`, each unless
    /// another graph still names it (one saved under a new name keeps the imported
    /// weights); false if the graph did not exist.
    pub fn delete_graph(&self, name: &str) -> Result<bool> {
        let _one_at_a_time = changing();
        let named = self.keep_version(name)?;
        let deleted = match std::fs::remove_file(self.graphs().join(Workspace::graph_file(name)?)) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(e).context("cannot delete the graph"),
        };
        let still = self.named()?;
        let own = [
            named.filter(|f| committed_file(f)),
            Some(weights_file(name)),
        ];
        for file in own.into_iter().flatten() {
            if !still.includes(&file) {
                remove_if_present(&self.graphs().join(&file))
                    .context("cannot delete the graph's weights")?;
            }
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

    /// Keeps the weights a run request sent with its graph as the run's
    /// `weights.safetensors` (after [`Workspace::keep_request`], which makes the folder).
    pub fn keep_weights(&self, id: &str, bytes: &[u8]) -> Result<()> {
        write_durably(&self.run_dir(id)?, "weights.safetensors", bytes)
    }

    /// A run's kept weights (at most [`MAX_WEIGHTS_FILE`]).
    pub fn kept_weights(&self, id: &str) -> Result<Vec<u8>> {
        let p = self.run_dir(id)?.join("weights.safetensors");
        read_bounded(&p, MAX_WEIGHTS_FILE).with_context(|| format!("cannot read {}", p.display()))
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

    /// A model's graph text (named `tag`) naming its weights as committed under `name`.
    fn model(name: &str, tag: &str, weights: &[u8]) -> Vec<u8> {
        let file = committed_weights_file(name, weights);
        format!(r#"{{"name": "{tag}", "params": {{"file": "{file}"}}}}"#).into_bytes()
    }

    /// The stored graph `name`'s `name` field and the weights its `params.file` names.
    fn pair(ws: &Workspace, name: &str) -> (String, Option<Vec<u8>>) {
        let text = ws.read_graph(name).unwrap().unwrap();
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        let file = doc["params"]["file"].as_str().unwrap();
        let tag = doc["name"].as_str().unwrap_or("").to_string();
        (tag, ws.read_weights(file).unwrap())
    }

    #[test]
    fn a_model_is_stored_with_its_weights_and_deleted_with_them() {
        let root = temp("model");
        let (ws, held) = Workspace::open(&root).unwrap();
        let file = committed_weights_file("m", b"weights");
        assert!(committed_file(&file) && valid_weights_file(&file));
        assert!(!settable_weights_file(&file));
        ws.write_model("m", &model("m", "a", b"weights"), b"weights")
            .unwrap();
        assert_eq!(pair(&ws, "m"), ("a".into(), Some(b"weights".to_vec())));
        assert!(ws.has_weights(&file).unwrap());
        assert!(ws.list_graphs().unwrap().contains(&"m".to_string()));
        // A graph that does not name the weights committed with it is refused.
        assert!(ws.write_model("m", b"{}", b"weights").is_err());
        assert!(ws
            .write_model("m", &model("m", "a", b"other"), b"weights")
            .is_err());
        assert!(ws.delete_graph("m").unwrap());
        assert!(ws.read_weights(&file).unwrap().is_none());
        assert!(!ws.has_weights(&file).unwrap());
        assert!(!ws.delete_graph("m").unwrap());
        // A graph saved under another name that still reads the weights keeps them.
        ws.write_model("m", &model("m", "a", b"weights"), b"weights")
            .unwrap();
        let copy = format!(r#"{{"params": {{"file": "{file}"}}}}"#);
        ws.write_graph("copy", copy.as_bytes()).unwrap();
        assert!(ws.delete_graph("m").unwrap());
        assert!(ws.has_weights(&file).unwrap(), "'copy' still names them");
        // A graph that cannot be parsed might name them too: they stay.
        ws.write_graph("copy", b"{ not json").unwrap();
        ws.write_model("m", &model("m", "a", b"weights"), b"weights")
            .unwrap();
        assert!(ws.delete_graph("m").unwrap());
        assert!(ws.has_weights(&file).unwrap());
        // A replaced model's weights leave the graphs with it (its version keeps them).
        ws.write_graph("copy", b"{}").unwrap();
        ws.write_model("m", &model("m", "a", b"one"), b"one")
            .unwrap();
        ws.write_model("m", &model("m", "b", b"two"), b"two")
            .unwrap();
        assert!(!ws
            .has_weights(&committed_weights_file("m", b"one"))
            .unwrap());
        assert_eq!(pair(&ws, "m"), ("b".into(), Some(b"two".to_vec())));
        // Committed weights no graph names (a crash's leftovers) are dropped on opening.
        let left = committed_weights_file("x", b"left");
        std::fs::write(root.join("graphs").join(&left), b"left").unwrap();
        drop(held);
        let (ws, _held) = Workspace::open(&root).unwrap();
        assert!(!ws.has_weights(&left).unwrap());
        assert_eq!(pair(&ws, "m"), ("b".into(), Some(b"two".to_vec())));
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn concurrent_models_of_one_name_never_pair_a_graph_with_other_weights() {
        let root = temp("model-race");
        let (ws, _held) = Workspace::open(&root).unwrap();
        let models: Vec<(String, Vec<u8>)> = ["a", "b"]
            .iter()
            .map(|tag| (tag.to_string(), tag.repeat(1000).into_bytes()))
            .collect();
        ws.write_model("race", &model("race", "a", &models[0].1), &models[0].1)
            .unwrap();
        let done = std::sync::atomic::AtomicBool::new(false);
        let mismatches = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            // A reader all along: a graph and then the weights it names.
            s.spawn(|| {
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    let (tag, weights) = pair(&ws, "race");
                    let own = models.iter().find(|m| m.0 == tag).map(|m| &m.1);
                    // Weights a newer commit dropped read as missing, never as others'.
                    if weights.is_some_and(|w| Some(&w) != own) {
                        mismatches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
            for _ in 0..300 {
                let barrier = std::sync::Barrier::new(2);
                std::thread::scope(|round| {
                    for (tag, weights) in &models {
                        let (ws, barrier) = (&ws, &barrier);
                        round.spawn(move || {
                            barrier.wait();
                            ws.write_model("race", &model("race", tag, weights), weights)
                                .unwrap();
                        });
                    }
                });
                let (tag, weights) = pair(&ws, "race");
                let own = models.iter().find(|m| m.0 == tag).map(|m| m.1.clone());
                assert_eq!(weights, own, "graph '{tag}' with other weights");
            }
            done.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        assert_eq!(mismatches.into_inner(), 0, "a reader saw a mixed pair");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn versions_keep_the_weights_their_graph_named_and_restore_both() {
        let root = temp("model-versions");
        let (ws, _held) = Workspace::open(&root).unwrap();
        let newest = |name: &str| ws.list_versions(name).unwrap()[0].version.clone();
        ws.write_model("m", &model("m", "a", b"one"), b"one")
            .unwrap();
        ws.write_model("m", &model("m", "b", b"two"), b"two")
            .unwrap();
        // The older model, restored: its own weights.
        assert!(ws.restore_version("m", &newest("m")).unwrap());
        assert_eq!(pair(&ws, "m"), ("a".into(), Some(b"one".to_vec())));
        // Deleted, then restored: its weights come back with it.
        assert!(ws.delete_graph("m").unwrap());
        assert!(!ws
            .has_weights(&committed_weights_file("m", b"one"))
            .unwrap());
        assert!(ws.restore_version("m", &newest("m")).unwrap());
        assert_eq!(pair(&ws, "m"), ("a".into(), Some(b"one".to_vec())));
        assert!(!ws.restore_version("m", "1").unwrap());
        // Weights put by name over a graph's: the replaced ones are kept with a version,
        // and restored committed (the name they were put under may change again).
        ws.write_weights("e.safetensors", b"first").unwrap();
        ws.write_graph(
            "e",
            br#"{"name": "e", "params": {"file": "e.safetensors"}}"#,
        )
        .unwrap();
        ws.write_weights("e.safetensors", b"second").unwrap();
        assert_eq!(pair(&ws, "e"), ("e".into(), Some(b"second".to_vec())));
        assert!(ws.restore_version("e", &newest("e")).unwrap());
        assert_eq!(pair(&ws, "e"), ("e".into(), Some(b"first".to_vec())));
        assert_eq!(
            ws.read_weights("e.safetensors").unwrap().unwrap(),
            b"second",
            "other graphs naming the file keep what was put last"
        );
        // A model's committed weights cannot be put over.
        let committed = committed_weights_file("m", b"one");
        assert!(ws.write_weights(&committed, b"other").is_err());
        assert_eq!(ws.read_weights(&committed).unwrap().unwrap(), b"one");
        // Old versions leave with their weights.
        for k in 0..KEPT_VERSIONS + 3 {
            let w = format!("w{k}").into_bytes();
            ws.write_model("m", &model("m", "a", &w), &w).unwrap();
        }
        let kept = std::fs::read_dir(root.join("versions/m"))
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
            .count();
        assert_eq!(ws.list_versions("m").unwrap().len(), KEPT_VERSIONS);
        assert_eq!(kept, KEPT_VERSIONS);
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
