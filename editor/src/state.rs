//! The editor's state: the document and its history, selection, view, the engine's live
//! analysis, run settings and the current run. One `Copy` handle of signals passed to
//! every component; every edit goes through [`EditorState::edit`] so that undo sees it.

use crate::check::{self, StageSettings};
use crate::groups;
use crate::history::History;
use crate::model;
use crate::schema::{self, OpInfo};
use leptos::prelude::*;
use sluice_engine::gpu::AdapterSummary;
use sluice_engine::graph::Graph;
use sluice_engine::graph::{Analysis, GraphDoc};
use sluice_engine::plan::cost::Rates;
use sluice_engine::telemetry::Event;
use sluice_engine::weights::Weights;
use std::collections::{BTreeMap, BTreeSet};

/// Pan and zoom of the canvas: canvas point p is drawn at `p * k + (tx, ty)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Viewport {
    /// Horizontal offset in pixels.
    pub tx: f64,
    /// Vertical offset in pixels.
    pub ty: f64,
    /// Zoom factor.
    pub k: f64,
}

impl Default for Viewport {
    fn default() -> Self {
        Viewport {
            tx: 0.0,
            ty: 0.0,
            k: 1.0,
        }
    }
}

/// A pointer gesture in progress (client coordinates are the page's, canvas
/// coordinates the graph's).
#[derive(Debug, Clone, PartialEq)]
pub enum Drag {
    /// An operator dragged from the palette; `at` in client coordinates.
    Palette {
        /// Operator (or `input`).
        op: String,
        /// Where the pointer went down.
        start: [f64; 2],
        /// Where it is.
        at: [f64; 2],
    },
    /// Panning the view.
    Pan {
        /// Client point where it started.
        start: [f64; 2],
        /// The view then.
        view: Viewport,
        /// Whether the pointer moved (a click on the background clears the selection).
        moved: bool,
    },
    /// Moving the selected nodes.
    Move {
        /// Canvas point where it started.
        start: [f64; 2],
        /// The document then (positions, and for undo); boxed, as documents are large.
        before: Box<GraphDoc>,
    },
    /// Drawing a connection from an output.
    Wire {
        /// The output reference.
        from: String,
        /// The pointer, in canvas coordinates.
        at: [f64; 2],
    },
    /// Box selection, in canvas coordinates.
    Select {
        /// First corner.
        start: [f64; 2],
        /// Second corner.
        at: [f64; 2],
    },
}

/// A search menu over the canvas (quick-add, keyboard connect), at a client point.
#[derive(Debug, Clone, PartialEq)]
pub enum Menu {
    /// Adds an operator (or a graph input) at `at`, in canvas coordinates; connected from
    /// output `from` when set (a wire dropped on the empty canvas, or the selected node).
    Add {
        /// Where the new node goes (its top-left corner).
        at: [f64; 2],
        /// Where the menu shows, in client coordinates.
        screen: [f64; 2],
        /// The output reference the new node reads, if any.
        from: Option<String>,
        /// The input (node, port) the new node's output then feeds, if any (a node
        /// inserted into an edge).
        then: Option<(String, usize)>,
    },
    /// Connects output `from` to one of the inputs that can take it.
    Connect {
        /// The output reference.
        from: String,
        /// Where the menu shows, in client coordinates.
        screen: [f64; 2],
    },
}

/// What a right-click opened a context menu on.
#[derive(Debug, Clone, PartialEq)]
pub enum ContextTarget {
    /// A node or graph input.
    Node(String),
    /// The edge into input `port` of `node`.
    Edge(String, usize),
    /// The empty canvas, at this canvas point.
    Canvas([f64; 2]),
}

/// Where a run goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The server's workers (or its local adapter).
    Server,
    /// WebGPU in this page.
    Browser,
}

/// The run panel's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSettings {
    /// Where to run.
    pub target: Target,
    /// Samples per batch.
    pub batch: usize,
    /// Micro-batches per batch.
    pub microbatches: usize,
    /// Pipeline stages.
    pub stages: usize,
    /// Prefetch slots.
    pub prefetch: usize,
    /// `f32`, `mixed` or `f16`.
    pub precision: String,
    /// Seed of the random inputs.
    pub seed: u64,
}

impl Default for RunSettings {
    fn default() -> Self {
        RunSettings {
            target: Target::Server,
            batch: 8,
            microbatches: 1,
            stages: 1,
            prefetch: 2,
            precision: "f32".into(),
            seed: 0,
        }
    }
}

impl RunSettings {
    /// The settings that decide stage placement.
    pub fn stage_settings(&self) -> StageSettings {
        StageSettings {
            batch: self.batch,
            microbatches: self.microbatches,
            stages: self.stages,
        }
    }
}

/// Where a run is.
#[derive(Debug, Clone, PartialEq)]
pub enum RunStatus {
    /// No run yet.
    Idle,
    /// Queued, compiling or running; the text says which.
    Active(String),
    /// Finished with outputs.
    Succeeded,
    /// Failed, with the reason.
    Failed(String),
    /// Cancelled.
    Cancelled,
}

/// One output of a finished run.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputView {
    /// Output name.
    pub name: String,
    /// File name of its `.npy`.
    pub file: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// Element type.
    pub dtype: String,
    /// First values.
    pub first: Vec<f64>,
    /// Sum of all values.
    pub checksum: f64,
    /// Count of NaN and infinite values.
    pub non_finite: usize,
    /// The `.npy` bytes, for in-browser runs (server runs download from the server).
    pub npy: Option<Vec<u8>>,
}

/// The current (or last) run, as the charts and the output list show it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunView {
    /// Increases with every run started; late messages of older runs are dropped.
    pub serial: u64,
    /// Where it runs.
    pub target: Target,
    /// Status.
    pub status: RunStatus,
    /// The server's run id.
    pub run_id: Option<String>,
    /// Settings it was started with.
    pub settings: RunSettings,
    /// Events so far.
    pub events: Vec<Event>,
    /// Outputs once finished.
    pub outputs: Vec<OutputView>,
    /// Device names, one per stage.
    pub devices: Vec<String>,
    /// Planned and allocated device bytes, when known.
    pub memory: Option<(u64, u64)>,
    /// Where compute times come from.
    pub timing: Option<String>,
    /// The matmul kernels the autotuner chose for this run's adapter, one line each
    /// (browser runs; `None` where the editor cannot know, as for server runs).
    pub tuning: Option<Vec<String>>,
}

impl Default for RunView {
    fn default() -> Self {
        RunView {
            serial: 0,
            target: Target::Server,
            status: RunStatus::Idle,
            run_id: None,
            settings: RunSettings::default(),
            events: Vec::new(),
            outputs: Vec::new(),
            devices: Vec::new(),
            memory: None,
            timing: None,
            tuning: None,
        }
    }
}

/// Applies a change to the run view while it still shows the run that asks.
pub type UpdateRun = dyn Fn(&dyn Fn(&mut RunView)) + Sync;

/// The updater of one run: changes reach the run view only while it still shows that run
/// (a newer run's view ignores an older run's late messages).
#[derive(Clone, Copy)]
pub struct RunUpdater {
    run: RwSignal<RunView>,
    serial: u64,
}

impl RunUpdater {
    /// Applies `f` to the run view if it still shows this run.
    pub fn update(&self, f: &dyn Fn(&mut RunView)) {
        let serial = self.serial;
        self.run.update(|r| {
            if r.serial == serial {
                f(r)
            }
        })
    }
}

impl RunView {
    /// Whether the run is still going.
    pub fn is_active(&self) -> bool {
        matches!(self.status, RunStatus::Active(_))
    }
}

/// A message for the user.
#[derive(Debug, Clone, PartialEq)]
pub struct Notice {
    /// An error (shown red) or information.
    pub error: bool,
    /// The sentence.
    pub text: String,
    /// Distinguishes notices with the same text, so each one shows anew.
    pub serial: u64,
}

/// Which tab the side panel shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Panel {
    /// The selected node's properties.
    Properties,
    /// Run settings, outputs.
    Run,
    /// Workers and adapters.
    Devices,
}

/// A node's (or graph input's) input and output port names, as drawn.
pub type PortNames = (Vec<String>, Vec<String>);

/// Every signal of the editor.
#[derive(Clone, Copy)]
pub struct EditorState {
    /// The document being edited.
    pub doc: RwSignal<GraphDoc>,
    /// Undo and redo.
    pub history: StoredValue<History>,
    /// The document as last saved or opened (engine form), to tell unsaved changes.
    pub saved: RwSignal<Option<GraphDoc>>,
    /// Selected nodes and inputs.
    pub selection: RwSignal<BTreeSet<String>>,
    /// The selected edge: (target node, input port).
    pub selected_edge: RwSignal<Option<(String, usize)>>,
    /// Pan and zoom.
    pub view: RwSignal<Viewport>,
    /// The operator palette.
    pub ops: RwSignal<Vec<OpInfo>>,
    /// Graphs in the server's workspace.
    pub graphs: RwSignal<Vec<String>>,
    /// The document without positions: what moving nodes leaves unchanged.
    pub unplaced: Memo<GraphDoc>,
    /// The names of every node's and graph input's (input, output) ports, as drawn.
    pub ports: Memo<BTreeMap<String, PortNames>>,
    /// The engine's analysis of the document.
    pub analysis: Memo<Analysis>,
    /// Stage of every node for the run settings, or why there is no split.
    pub stages: Memo<Result<BTreeMap<String, usize>, String>>,
    /// The latest message.
    pub notice: RwSignal<Option<Notice>>,
    /// Run settings.
    pub settings: RwSignal<RunSettings>,
    /// The current run.
    pub run: RwSignal<RunView>,
    /// Paint per-node GPU time on the graph.
    pub heat: RwSignal<bool>,
    /// Copied nodes.
    pub clip: StoredValue<Option<GraphDoc>>,
    /// The help overlay is open.
    pub help: RwSignal<bool>,
    /// The operator palette is shown (it folds away for a wider canvas).
    pub palette_open: RwSignal<bool>,
    /// The side panel (properties, run, devices) is shown.
    pub side_open: RwSignal<bool>,
    /// The Versions panel: a graph's name and its kept versions, while open.
    pub versions: RwSignal<Option<(String, Vec<sluice_api::GraphVersion>)>>,
    /// The side panel's tab.
    pub panel: RwSignal<Panel>,
    /// The pointer gesture in progress.
    pub drag: RwSignal<Option<Drag>>,
    /// The blocks drawn collapsed, by block name ([`crate::groups`]).
    pub collapsed: RwSignal<BTreeSet<String>>,
    /// Every block of the graph with its nodes.
    pub blocks: Memo<BTreeMap<String, Vec<String>>>,
    /// The canvas's view of the collapsed blocks.
    pub collapsed_view: Memo<groups::Collapsed>,
    /// The search menu open over the canvas, if any.
    pub menu: RwSignal<Option<Menu>>,
    /// The context menu: what it is for and where it shows (client coordinates).
    pub context: RwSignal<Option<(ContextTarget, [f64; 2])>>,
    /// This page's WebGPU adapter, or why there is none (None: not probed yet).
    pub browser_gpu: RwSignal<Option<Result<AdapterSummary, String>>>,
    /// The calibrated rates of the server's devices (None: not reported; assumed rates
    /// place the stages then).
    pub server_rates: RwSignal<Option<Rates>>,
    /// The weights that came with the document (an imported ONNX model's), by key; None:
    /// the graph's weights are seeded. Edits keep them: [`EditorState::weights_for`]
    /// uses those that still fit.
    pub weights: StoredValue<Option<Weights>>,
    /// Whether the document had weights of its own (an imported model's) that a reload
    /// did not keep: its runs, here and on the server, use seeded weights, which the run
    /// panel says until another document is loaded.
    pub weights_lost: RwSignal<bool>,
}

impl EditorState {
    /// Fresh state holding `doc`.
    pub fn new(doc: GraphDoc) -> EditorState {
        let doc = RwSignal::new(doc);
        let settings = RwSignal::new(RunSettings::default());
        // The analysis ignores positions: moving a node does not re-check the graph.
        let unplaced = Memo::new(move |_| {
            doc.with(|d| {
                let mut s = d.clone();
                s.layout.clear();
                s
            })
        });
        let structure = Memo::new(move |_| unplaced.with(model::for_engine));
        let analysis = Memo::new(move |_| structure.with(check::analyse));
        let ops = RwSignal::new(Vec::<OpInfo>::new());
        let collapsed = RwSignal::new(BTreeSet::<String>::new());
        let blocks = Memo::new(move |_| unplaced.with(groups::blocks));
        let collapsed_view = Memo::new(move |_| {
            unplaced.with(|d| blocks.with(|b| collapsed.with(|c| groups::collapse(d, b, c))))
        });
        let ports = Memo::new(move |_| {
            ops.with(|ops| {
                analysis.with(|a| {
                    unplaced.with(|d| {
                        model::ids(d)
                            .into_iter()
                            .map(|id| {
                                let inferred = a.types.get(&id).map(Vec::len);
                                let names = schema::port_names(ops, d, &id, inferred);
                                (id, names)
                            })
                            .collect()
                    })
                })
            })
        });
        let server_rates = RwSignal::new(None::<Rates>);
        let stages = Memo::new(move |_| {
            let s = settings.with(RunSettings::stage_settings);
            let rates = server_rates.get().unwrap_or(Rates::ASSUMED);
            structure.with(|d| check::stage_of_nodes(d, s, &rates))
        });
        EditorState {
            doc,
            history: StoredValue::new(History::default()),
            saved: RwSignal::new(None),
            selection: RwSignal::new(BTreeSet::new()),
            selected_edge: RwSignal::new(None),
            view: RwSignal::new(Viewport::default()),
            ops,
            unplaced,
            ports,
            graphs: RwSignal::new(Vec::new()),
            analysis,
            stages,
            notice: RwSignal::new(None),
            settings,
            run: RwSignal::new(RunView::default()),
            heat: RwSignal::new(false),
            clip: StoredValue::new(None),
            help: RwSignal::new(false),
            versions: RwSignal::new(None),
            palette_open: RwSignal::new(true),
            side_open: RwSignal::new(true),
            panel: RwSignal::new(Panel::Properties),
            drag: RwSignal::new(None),
            menu: RwSignal::new(None),
            collapsed,
            blocks,
            collapsed_view,
            context: RwSignal::new(None),
            browser_gpu: RwSignal::new(None),
            server_rates,
            weights: StoredValue::new(None),
            weights_lost: RwSignal::new(false),
        }
    }

    /// How wide node (or graph input) `id` is drawn, from its ports.
    pub fn drawn_width(&self, id: &str) -> f64 {
        self.ports.with_untracked(|p| {
            crate::layout::node_width(p.get(id).map_or((1, 1), |(i, o)| (i.len(), o.len())))
        })
    }

    /// Applies an edit; a refused edit changes nothing and says why.
    pub fn edit(&self, f: impl FnOnce(&mut GraphDoc) -> Result<(), String>) {
        let before = self.doc.get_untracked();
        let mut next = before.clone();
        match f(&mut next) {
            Ok(()) => self.replace(before, next),
            Err(e) => self.error(e),
        }
    }

    /// Makes `next` the document, recording `before` for undo when they differ.
    pub fn replace(&self, before: GraphDoc, next: GraphDoc) {
        if next != before {
            self.history.update_value(|h| h.record(before));
            self.doc.set(next);
        }
    }

    /// Loads a different document (opened or imported) with the weights that came with
    /// it (None: seeded): history and selection start over.
    pub fn load(&self, doc: GraphDoc, saved: Option<GraphDoc>, weights: Option<Weights>) {
        self.weights.set_value(weights);
        self.weights_lost.set(false);
        // The last run's charts and outputs belong to the graph being replaced (a run
        // still going keeps showing until it ends).
        self.run.update(|r| {
            if !r.is_active() {
                *r = RunView {
                    serial: r.serial + 1,
                    ..RunView::default()
                };
            }
        });
        self.history.update_value(History::clear);
        self.collapsed.set(BTreeSet::new());
        self.selection.set(BTreeSet::new());
        self.selected_edge.set(None);
        self.saved.set(saved);
        self.doc.set(doc);
    }

    /// Steps back one edit.
    pub fn undo(&self) {
        let current = self.doc.get_untracked();
        match self
            .history
            .try_update_value(|h| h.undo(&current))
            .flatten()
        {
            Some(previous) => self.doc.set(previous),
            None => self.info("nothing to undo"),
        }
        self.prune_selection();
    }

    /// Steps forward again.
    pub fn redo(&self) {
        let current = self.doc.get_untracked();
        match self
            .history
            .try_update_value(|h| h.redo(&current))
            .flatten()
        {
            Some(next) => self.doc.set(next),
            None => self.info("nothing to redo"),
        }
        self.prune_selection();
    }

    fn prune_selection(&self) {
        let ids = self.doc.with_untracked(model::ids);
        self.selection.update(|s| s.retain(|id| ids.contains(id)));
        self.selected_edge.set(None);
    }

    /// Whether the document differs from what was last saved or opened (a new graph:
    /// whether anything was put in it).
    pub fn dirty(&self) -> bool {
        let current = self.doc.with(model::for_engine);
        self.saved.with(|s| match s {
            Some(saved) => saved != &current,
            None => !current.inputs.is_empty() || !current.nodes.is_empty(),
        })
    }

    /// Shows a notice; information fades after a few seconds, errors stay until closed.
    fn notify(&self, error: bool, text: String) {
        // Serials never repeat (a closed notice must not hand its serial on: the fade
        // timer of an earlier notice would then close a later error).
        static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let serial = SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.notice.set(Some(Notice {
            error,
            text,
            serial,
        }));
        if !error {
            let notice = self.notice;
            set_timeout(
                move || {
                    if notice.with_untracked(|n| n.as_ref().is_some_and(|n| n.serial == serial)) {
                        notice.set(None);
                    }
                },
                std::time::Duration::from_secs(4),
            );
        }
    }

    /// Tells the user something went wrong.
    pub fn error(&self, text: impl Into<String>) {
        self.notify(true, text.into());
    }

    /// Tells the user something.
    pub fn info(&self, text: impl Into<String>) {
        self.notify(false, text.into());
    }

    /// Shows a new run going to `target` with the current settings; returns its updater.
    pub fn begin_run(&self, target: Target, status: &str) -> RunUpdater {
        let serial = self.run.with_untracked(|r| r.serial + 1);
        self.run.set(RunView {
            serial,
            target,
            status: RunStatus::Active(status.into()),
            settings: self.settings.get_untracked(),
            ..RunView::default()
        });
        RunUpdater {
            run: self.run,
            serial,
        }
    }

    /// The weights a run or an export of `graph` uses: the seeded ones (the graph's seed,
    /// as a server run draws them), each replaced by the document's own weight of that key
    /// where one came with it and still has the shape and type the graph declares.
    pub fn weights_for(&self, graph: &Graph) -> Weights {
        let mut weights =
            sluice_engine::weights::init_weights(graph, graph.doc.params.seed.unwrap_or(0));
        self.weights.with_value(|own| {
            for (key, seeded) in weights.iter_mut() {
                if let Some(t) = own.as_ref().and_then(|w| w.get(key)) {
                    if t.shape == seeded.shape && t.dtype() == seeded.dtype() {
                        *seeded = t.clone();
                    }
                }
            }
        });
        weights
    }

    /// The palette entry of an operator.
    pub fn op_info(&self, op: &str) -> Option<OpInfo> {
        self.ops
            .with(|ops| ops.iter().find(|o| o.name == op).cloned())
    }
}
