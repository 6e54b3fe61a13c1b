//! The matmul autotuner's settings and records: for each class of problem a plan meets
//! (see [`super::tuning::MatmulClass`]), every [`MatmulVariant`] the adapter can run is
//! timed on the problem's sizes (`super::variant_timing`) and the fastest kept, keyed by
//! adapter, problem class and precision. The engine keeps them in memory (in browsers, for
//! the page); a front that has files gives a [`TuningStore`] ([`install_store`]) so that a
//! class is measured once per adapter and driver. `SLUICE_AUTOTUNE=off` turns tuning off
//! (every problem gets the default variant).

use super::tuning::MatmulVariant;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

/// The format tag of the cache file.
pub const CACHE_FORMAT: &str = "sluice/autotune@1";

/// One variant's measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trial {
    /// The variant's name.
    pub variant: String,
    /// Milliseconds per dispatch (best of the measurements).
    pub ms: f64,
}

/// What the tuner decided for one class on one adapter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TuneRecord {
    /// The variant chosen.
    pub chosen: String,
    /// The sizes measured (M, N, K).
    pub measured_on: [usize; 3],
    /// Every variant tried, in the order tried.
    pub tried: Vec<Trial>,
}

/// The cache file: records by adapter, then by class key.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TuneCache {
    /// [`CACHE_FORMAT`].
    pub format: String,
    /// Adapter key (name, backend, driver) → class key → record.
    pub adapters: BTreeMap<String, BTreeMap<String, TuneRecord>>,
}

/// A decision the tuner made or read back in this process (for reports).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    /// The adapter key.
    pub adapter: String,
    /// The class key.
    pub class: String,
    /// The record.
    pub record: TuneRecord,
    /// Whether it was measured now (else read from the cache).
    pub measured: bool,
}

/// The autotuner of a device: whether it tunes, where its records are kept, and the
/// records.
#[derive(Debug)]
pub struct Autotuner {
    enabled: bool,
    forced: Option<MatmulVariant>,
    store: Option<Arc<dyn TuningStore>>,
    cache: Mutex<TuneCache>,
}

/// Decisions made in this process, newest last.
fn decisions() -> &'static Mutex<Vec<Decision>> {
    static LOG: OnceLock<Mutex<Vec<Decision>>> = OnceLock::new();
    LOG.get_or_init(Mutex::default)
}

/// Whether `SLUICE_AUTOTUNE` turns tuning off (`off`, `0`, `false` or `no`).
pub fn off_by_env() -> bool {
    std::env::var("SLUICE_AUTOTUNE").is_ok_and(|v| matches!(v.trim(), "off" | "0" | "false" | "no"))
}

/// Every tuning decision made (or read from the cache) in this process, oldest first.
pub fn decisions_so_far() -> Vec<Decision> {
    decisions().lock().map(|d| d.clone()).unwrap_or_default()
}

/// Where an autotuner keeps its records between processes.
pub trait TuningStore: Send + Sync + std::fmt::Debug {
    /// The records kept so far (empty when there are none or they cannot be read, which the
    /// store reports itself).
    fn load(&self) -> TuneCache;
    /// Keeps `cache`, merged with what other processes kept meanwhile; failing is reported,
    /// never fatal.
    fn save(&self, cache: &TuneCache);
}

fn installed() -> &'static OnceLock<Arc<dyn TuningStore>> {
    static STORE: OnceLock<Arc<dyn TuningStore>> = OnceLock::new();
    &STORE
}

/// Gives the process's shared autotuner ([`Autotuner::from_env`]) somewhere to keep its
/// records; call it before the first device opens. `false` when one was installed already.
pub fn install_store(store: Arc<dyn TuningStore>) -> bool {
    installed().set(store).is_ok()
}

impl Autotuner {
    /// Tuning as `SLUICE_AUTOTUNE` says, with the installed store ([`install_store`]),
    /// shared by every device of the process.
    pub fn from_env() -> Arc<Autotuner> {
        static SHARED: OnceLock<Arc<Autotuner>> = OnceLock::new();
        SHARED
            .get_or_init(|| Arc::new(Autotuner::new(!off_by_env(), installed().get().cloned())))
            .clone()
    }

    /// A tuner keeping its records in `store` (in memory only when `None`), tuning when
    /// `enabled`.
    pub fn new(enabled: bool, store: Option<Arc<dyn TuningStore>>) -> Autotuner {
        let cache = store.as_ref().map(|s| s.load()).unwrap_or_default();
        Autotuner {
            enabled,
            forced: None,
            store,
            cache: Mutex::new(cache),
        }
    }

    /// A tuner that measures nothing and gives every vec4 matmul `variant` (to test each
    /// variant through whole plans).
    pub fn forcing(variant: MatmulVariant) -> Autotuner {
        Autotuner {
            forced: Some(variant),
            ..Autotuner::new(false, None)
        }
    }

    /// The variant every matmul gets, when forced.
    pub fn forced(&self) -> Option<MatmulVariant> {
        self.forced
    }

    /// Whether it tunes.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The record of a class on an adapter, if the cache has a usable one.
    pub fn cached(&self, adapter: &str, class: &str) -> Option<TuneRecord> {
        self.cache
            .lock()
            .ok()
            .and_then(|c| c.adapters.get(adapter)?.get(class).cloned())
            .filter(|r| MatmulVariant::parse(&r.chosen).is_some())
    }

    /// Notes a decision for [`decisions_so_far`]; one `measured` now is also kept in the
    /// cache and saved.
    pub fn remember(&self, adapter: &str, class: &str, record: TuneRecord, measured: bool) {
        if measured {
            tracing::info!(
                "autotune: {class} on {adapter}: chose {} ({})",
                record.chosen,
                record
                    .tried
                    .iter()
                    .map(|t| format!("{} {:.3} ms", t.variant, t.ms))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            if let Ok(mut c) = self.cache.lock() {
                c.format = CACHE_FORMAT.into();
                c.adapters
                    .entry(adapter.to_string())
                    .or_default()
                    .insert(class.to_string(), record.clone());
            }
            self.save();
        }
        if let Ok(mut log) = decisions().lock() {
            log.push(Decision {
                adapter: adapter.to_string(),
                class: class.to_string(),
                record,
                measured,
            });
        }
    }

    /// Hands the records to the store, if any.
    fn save(&self) {
        if let (Some(store), Ok(cache)) = (&self.store, self.cache.lock()) {
            store.save(&cache);
        }
    }
}
