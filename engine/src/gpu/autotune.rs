//! The matmul autotuner's settings and records: for each class of problem a plan meets
//! (see [`super::tuning::MatmulClass`]), every [`MatmulVariant`] the adapter can run is
//! timed on the problem's sizes (`super::variant_timing`) and the fastest kept, keyed by
//! adapter, problem class and precision. The engine keeps them in memory (in browsers, for
//! the page); a front that has files gives a [`TuningStore`] ([`install_store`]) so that a
//! class is measured once per adapter and driver. `SLUICE_AUTOTUNE=off` turns tuning off
//! (every problem gets the default variant).

use super::tuning::MatmulVariant;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
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
    /// The variants not tried: the adapter cannot run them or the sizes do not suit them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
}

impl TuneRecord {
    /// Whether the record weighed every variant this build knows (tried or skipped): a
    /// record from a build with fewer variants is measured again.
    pub fn is_complete(&self) -> bool {
        MatmulVariant::ALL.iter().all(|v| {
            let name = v.name();
            self.tried.iter().any(|t| t.variant == name) || self.skipped.contains(&name)
        })
    }
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

/// Decisions kept for reports: the newest, as many as a long-running server needs.
const KEPT_DECISIONS: usize = 256;

/// The decisions made in this process: how many so far, and the newest
/// [`KEPT_DECISIONS`] of them.
fn decisions() -> &'static Mutex<(u64, VecDeque<Decision>)> {
    static LOG: OnceLock<Mutex<(u64, VecDeque<Decision>)>> = OnceLock::new();
    LOG.get_or_init(Mutex::default)
}

/// How many tuning decisions this process has made (or read from the cache) so far.
pub fn decision_count() -> u64 {
    decisions().lock().map_or(0, |log| log.0)
}

/// The decisions made since there were `count` (see [`decision_count`]), oldest first,
/// as far as they are still kept.
pub fn decisions_since(count: u64) -> Vec<Decision> {
    let Ok(log) = decisions().lock() else {
        return Vec::new();
    };
    let (total, kept) = (&log.0, &log.1);
    let first_kept = total - kept.len() as u64;
    let skip = count.saturating_sub(first_kept);
    kept.iter()
        .skip(usize::try_from(skip).unwrap_or(usize::MAX))
        .cloned()
        .collect()
}

/// Whether `SLUICE_AUTOTUNE` turns tuning off (`off`, `0`, `false` or `no`).
pub fn off_by_env() -> bool {
    std::env::var("SLUICE_AUTOTUNE").is_ok_and(|v| matches!(v.trim(), "off" | "0" | "false" | "no"))
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

    /// The record of a class on an adapter, if the cache has a usable one (naming a known
    /// variant, and complete: see [`TuneRecord::is_complete`]).
    pub fn cached(&self, adapter: &str, class: &str) -> Option<TuneRecord> {
        self.cache
            .lock()
            .ok()
            .and_then(|c| c.adapters.get(adapter)?.get(class).cloned())
            .filter(|r| MatmulVariant::parse(&r.chosen).is_some() && r.is_complete())
    }

    /// Notes a decision for [`decisions_since`]; one `measured` now is also kept in the
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
            log.0 += 1;
            if log.1.len() == KEPT_DECISIONS {
                log.1.pop_front();
            }
            log.1.push_back(Decision {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_missing_a_variant_of_this_build_is_measured_again() {
        let trial = |v: &MatmulVariant| Trial {
            variant: v.name(),
            ms: 1.0,
        };
        let (last, earlier) = MatmulVariant::ALL.split_last().expect("variants");
        let mut record = TuneRecord {
            chosen: MatmulVariant::DEFAULT.name(),
            measured_on: [256, 256, 256],
            tried: earlier.iter().map(trial).collect(),
            skipped: Vec::new(),
        };
        assert!(!record.is_complete(), "an older build's record is stale");
        record.skipped.push(last.name());
        assert!(record.is_complete(), "skipped variants count as weighed");
        record.skipped.clear();
        record.tried.push(trial(last));
        assert!(record.is_complete());
    }

    #[test]
    fn the_decision_log_keeps_the_newest_and_counts_them_all() {
        let tuner = Autotuner::new(true, None);
        let record = TuneRecord {
            chosen: MatmulVariant::DEFAULT.name(),
            measured_on: [1, 1, 1],
            tried: Vec::new(),
            skipped: Vec::new(),
        };
        let start = decision_count();
        for i in 0..KEPT_DECISIONS + 10 {
            tuner.remember("adapter", &format!("class {i}"), record.clone(), false);
        }
        assert_eq!(decision_count(), start + KEPT_DECISIONS as u64 + 10);
        let kept = decisions_since(start);
        assert_eq!(kept.len(), KEPT_DECISIONS, "only the newest are kept");
        let last = KEPT_DECISIONS + 9;
        assert_eq!(
            kept.last().map(|d| d.class.clone()),
            Some(format!("class {last}"))
        );
        let last_two = decisions_since(decision_count() - 2);
        assert_eq!(
            last_two.iter().map(|d| d.class.clone()).collect::<Vec<_>>(),
            [format!("class {}", last - 1), format!("class {last}")]
        );
        assert!(decisions_since(decision_count()).is_empty());
    }
}
