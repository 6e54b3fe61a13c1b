//! The property panel: for one selected operator its id, documentation, attributes
//! (edited by the schema's types, defaults shown, each with its doc line), which outputs
//! are graph outputs, its stage pin, where the batch lives (and whether it couples samples)
//! and its problems; for a graph input its name, shape, dtype and batch axis; with nothing
//! selected, the graph's own settings. A value that does not read
//! is shown with the reason and not applied.

use crate::model::{self, output_ref};
use crate::schema::{self, AttrInfo, AttrKind};
use crate::state::EditorState;
use leptos::prelude::*;
use serde_json::Value;
use sluice_engine::DType;

/// The panel.
#[component]
pub fn Properties(state: EditorState) -> impl IntoView {
    // Why the last typed value was not applied: (node, field) → reason.
    let field_error = RwSignal::new(None::<(String, String, String)>);
    move || {
        let selection = state.selection.get();
        if selection.len() > 1 {
            return view! {
                <div class="props">
                    <h3>{format!("{} nodes selected", selection.len())}</h3>
                    <button on:click=move |_| super::actions::delete_selection(state)>"Delete them"</button>
                </div>
            }
            .into_any();
        }
        let Some(id) = selection.into_iter().next() else {
            return graph_props(state).into_any();
        };
        if state.unplaced.with(|d| model::is_input(d, &id)) {
            input_props(state, id, field_error).into_any()
        } else if state.unplaced.with(|d| model::node(d, &id).is_some()) {
            op_props(state, id, field_error).into_any()
        } else {
            graph_props(state).into_any()
        }
    }
}

fn error_line(
    field_error: RwSignal<Option<(String, String, String)>>,
    id: &str,
    field: &str,
) -> impl IntoView {
    let (id, field) = (id.to_string(), field.to_string());
    move || {
        field_error.get().and_then(|(i, f, m)| {
            (i == id && f == field).then(|| view! { <div class="field-error">{m}</div> })
        })
    }
}

fn rename_field(
    state: EditorState,
    id: String,
    field_error: RwSignal<Option<(String, String, String)>>,
) -> impl IntoView {
    let old = id.clone();
    view! {
        <label class="field">
            <span class="field-name">{if state.doc.with_untracked(|d| model::is_input(d, &id)) { "name" } else { "id" }}</span>
            <input id="prop-id" type="text" prop:value=id.clone() spellcheck="false"
                on:change=move |ev| {
                    let new = event_target_value(&ev).trim().to_string();
                    let mut result = Ok(());
                    state.edit(|d| { result = model::rename(d, &old, &new); result.clone() });
                    match result {
                        Ok(()) => {
                            field_error.set(None);
                            state.selection.set([new].into());
                        }
                        Err(e) => field_error.set(Some((old.clone(), "id".into(), e))),
                    }
                } />
        </label>
        {error_line(field_error, &id, "id")}
    }
}

fn problems_of(state: EditorState, id: &str) -> impl IntoView {
    let items: Vec<String> = state.analysis.with(|a| {
        a.problems_of(id)
            .map(|p| format!("{}: {}", p.field, p.message))
            .collect()
    });
    (!items.is_empty()).then(|| {
        view! {
            <div class="node-problems">
                <h4>"Problems"</h4>
                <ul>{items.into_iter().map(|m| view! { <li>{m}</li> }).collect_view()}</ul>
            </div>
        }
    })
}

fn batch_of(state: EditorState, id: &str) -> impl IntoView {
    let line = state.analysis.with(|a| {
        crate::check::batch_line(a, id).map(|l| (l, a.couplings.iter().any(|c| c.node == id)))
    });
    line.map(|(text, couples)| view! { <p class="batch-note" class:couples=couples>{text}</p> })
}

fn output_types(state: EditorState, id: &str) -> Vec<String> {
    state.analysis.with(|a| {
        a.types
            .get(id)
            .map(|ts| ts.iter().map(|t| t.to_string()).collect())
            .unwrap_or_default()
    })
}

fn outputs_field(state: EditorState, id: &str, names: Vec<String>) -> impl IntoView {
    let types = output_types(state, id);
    let count = types.len().max(names.len()).max(1);
    let rows = (0..count)
        .map(|k| {
            let reference = output_ref(id, k);
            let on = state.unplaced.with(|d| d.outputs.contains(&reference));
            let name = names.get(k).cloned().unwrap_or_else(|| format!("out{k}"));
            let ty = types.get(k).cloned().unwrap_or_else(|| "not inferred yet".into());
            view! {
                <label class="check">
                    <input type="checkbox" class="graph-output" data-ref=reference.clone() prop:checked=on
                        on:change=move |ev| {
                            let on = event_target_checked(&ev);
                            state.edit(|d| { model::set_output(d, &reference, on); Ok(()) });
                        } />
                    {format!(" {name}: {ty} — graph output")}
                </label>
            }
        })
        .collect_view();
    view! { <div class="outputs"><h4>"Outputs"</h4>{rows}</div> }
}

fn input_props(
    state: EditorState,
    id: String,
    field_error: RwSignal<Option<(String, String, String)>>,
) -> impl IntoView {
    let decl = state.unplaced.with(|d| d.inputs.get(&id).cloned());
    let Some(decl) = decl else {
        return ().into_any();
    };
    let (id_shape, id_dtype) = (id.clone(), id.clone());
    let dtype_now = decl.dtype;
    let shape_text = model::show_shape(&decl.shape);
    view! {
        <div class="props">
            <h3>"Graph input"</h3>
            {rename_field(state, id.clone(), field_error)}
            <label class="field">
                <span class="field-name">"shape"</span>
                <input id="prop-shape" type="text" prop:value=shape_text spellcheck="false"
                    on:change=move |ev| {
                        match model::parse_shape(&event_target_value(&ev)) {
                            Ok(shape) => {
                                field_error.set(None);
                                let dtype = state.doc.with_untracked(|d| d.inputs.get(&id_shape).map(|i| i.dtype)).unwrap_or(DType::F32);
                                state.edit(|d| { model::set_input_decl(d, &id_shape, shape, dtype); Ok(()) });
                            }
                            Err(e) => field_error.set(Some((id_shape.clone(), "shape".into(), e))),
                        }
                    } />
                <span class="field-doc">"Sizes and symbols, e.g. N, 784 (N is bound to the batch size)."</span>
            </label>
            {error_line(field_error, &id, "shape")}
            <label class="field">
                <span class="field-name">"dtype"</span>
                <select id="prop-dtype" on:change=move |ev| {
                    if let Some(dtype) = DType::parse(&event_target_value(&ev)) {
                        let shape = state.doc.with_untracked(|d| d.inputs.get(&id_dtype).map(|i| i.shape.clone())).unwrap_or_default();
                        state.edit(|d| { model::set_input_decl(d, &id_dtype, shape, dtype); Ok(()) });
                    }
                }>
                    {DType::ALL.into_iter().map(|t| view! {
                        <option value=t.name() selected=t == dtype_now>{t.name()}</option>
                    }).collect_view()}
                </select>
            </label>
            {outputs_field(state, &id, vec![id.clone()])}
            {batch_of(state, &id)}
            {problems_of(state, &id)}
        </div>
    }
    .into_any()
}

fn attr_field(
    state: EditorState,
    id: &str,
    attr: AttrInfo,
    current: Option<Value>,
    field_error: RwSignal<Option<(String, String, String)>>,
) -> impl IntoView {
    let (node, name) = (id.to_string(), attr.name.clone());
    let kind = attr.kind.clone();
    let required = attr.default.is_none();
    let placeholder = attr
        .default
        .as_deref()
        .map(|d| {
            if d == "null" {
                "unset".to_string()
            } else {
                format!("default {d}")
            }
        })
        .unwrap_or_else(|| "required".into());
    let apply = move |text: String| match schema::parse_value(&kind, &text) {
        Ok(v) => {
            field_error.set(None);
            state.edit(|d| {
                model::set_attr(d, &node, &name, v);
                Ok(())
            });
        }
        Err(e) => field_error.set(Some((node.clone(), name.clone(), e))),
    };
    let control = match &attr.kind {
        AttrKind::Bool => {
            let default_on = attr.default.as_deref() == Some("true");
            let on = current
                .as_ref()
                .and_then(Value::as_bool)
                .unwrap_or(default_on);
            view! {
                <input type="checkbox" data-attr=attr.name.clone() prop:checked=on
                    on:change=move |ev| apply(event_target_checked(&ev).to_string()) />
            }
            .into_any()
        }
        AttrKind::Choice(options) => {
            let now = current
                .as_ref()
                .and_then(Value::as_str)
                .map(String::from)
                .or_else(|| {
                    attr.default
                        .as_deref()
                        .map(|d| d.trim_matches('"').to_string())
                })
                .unwrap_or_default();
            view! {
                <select data-attr=attr.name.clone() on:change=move |ev| apply(event_target_value(&ev))>
                    {options.iter().map(|o| view! {
                        <option value=o.clone() selected=*o == now>{o.clone()}</option>
                    }).collect_view()}
                </select>
            }
            .into_any()
        }
        _ => {
            let text = current.as_ref().map(schema::show_value).unwrap_or_default();
            view! {
                <input type="text" data-attr=attr.name.clone() prop:value=text placeholder=placeholder
                    spellcheck="false" on:change=move |ev| apply(event_target_value(&ev)) />
            }
            .into_any()
        }
    };
    view! {
        <label class="field" class:required=required>
            <span class="field-name">{attr.name.clone()}
                {required.then(|| view! { <span class="required-mark" title="required">" *"</span> })}
            </span>
            {control}
            <span class="field-doc">{attr.doc.clone()}</span>
        </label>
        {error_line(field_error, id, &attr.name)}
    }
}

fn stage_field(state: EditorState, id: &str) -> impl IntoView {
    let pin = state.unplaced.with(|d| d.stages.get(id).copied());
    let placed = state
        .stages
        .with(|s| s.as_ref().ok().and_then(|m| m.get(id).copied()));
    let count = state
        .settings
        .with(|s| s.stages)
        .max(pin.map_or(1, |p| p + 1));
    let node = id.to_string();
    view! {
        <label class="field">
            <span class="field-name">"stage"</span>
            <select id="prop-stage" on:change=move |ev| {
                let v = event_target_value(&ev).parse::<usize>().ok();
                state.edit(|d| { model::set_stage(d, &node, v); Ok(()) });
            }>
                <option value="auto" selected=pin.is_none()>
                    {format!("auto{}", placed.map(|s| format!(" (now {s})")).unwrap_or_default())}
                </option>
                {(0..count).map(|s| view! {
                    <option value=s.to_string() selected=pin == Some(s)>{format!("pinned to {s}")}</option>
                }).collect_view()}
            </select>
            <span class="field-doc">"Pipeline stage of this node; unpinned nodes are placed by the partitioner."</span>
        </label>
    }
}

fn op_props(
    state: EditorState,
    id: String,
    field_error: RwSignal<Option<(String, String, String)>>,
) -> impl IntoView {
    let Some(node) = state.unplaced.with(|d| model::node(d, &id).cloned()) else {
        return ().into_any();
    };
    let info = state.op_info(&node.op);
    let attrs = info.as_ref().map(|o| {
        o.attrs
            .iter()
            .cloned()
            .map(|a| {
                let current = node.attrs.get(&a.name).cloned();
                attr_field(state, &id, a, current, field_error)
            })
            .collect_view()
    });
    let params = info.as_ref().filter(|o| !o.params.is_empty()).map(|o| {
        // Keys of weights that came with an imported model are `node.param`.
        let imported = state.weights.with_value(|w| {
            w.as_ref().is_some_and(|w| {
                o.params
                    .iter()
                    .any(|p| w.contains_key(&format!("{id}.{p}")))
            })
        });
        let source = if imported {
            "imported with the model; one an edit reshapes is seeded"
        } else {
            "seeded from the graph's seed"
        };
        format!("Weights: {} ({source})", o.params.join(", "))
    });
    view! {
        <div class="props">
            <h3>{node.op.clone()}</h3>
            <p class="doc">{info.as_ref().map(|o| o.doc.clone()).unwrap_or_else(|| format!("'{}' is not an operator this server knows", node.op))}</p>
            {rename_field(state, id.clone(), field_error)}
            <div class="attrs">{attrs}</div>
            {params.map(|p| view! { <p class="doc">{p}</p> })}
            {outputs_field(state, &id, info.map(|o| o.outputs).unwrap_or_default())}
            {stage_field(state, &id)}
            {batch_of(state, &id)}
            {problems_of(state, &id)}
        </div>
    }
    .into_any()
}

fn graph_props(state: EditorState) -> impl IntoView {
    let doc = state.unplaced.get();
    let seed = doc.params.seed.map(|s| s.to_string()).unwrap_or_default();
    let problems = state.analysis.with(|a| a.problems.len());
    view! {
        <div class="props">
            <h3>"Graph"</h3>
            <p class="doc">{format!(
                "{} input(s), {} node(s), outputs: {}. {}",
                doc.inputs.len(),
                doc.nodes.len(),
                if doc.outputs.is_empty() { "none yet".to_string() } else { doc.outputs.join(", ") },
                if problems == 0 { "Valid.".to_string() } else { format!("{problems} problem(s).") }
            )}</p>
            <label class="field">
                <span class="field-name">"weight seed"</span>
                <input id="prop-seed" type="text" prop:value=seed on:change=move |ev| {
                    let text = event_target_value(&ev);
                    match text.trim().parse::<u64>() {
                        Ok(s) => state.edit(|d| { d.params.seed = Some(s); Ok(()) }),
                        Err(_) if text.trim().is_empty() => state.edit(|d| { d.params.seed = None; Ok(()) }),
                        Err(_) => state.error(format!("'{text}' is not a seed (a non-negative integer)")),
                    }
                } />
                <span class="field-doc">"Weights are initialised deterministically from this seed."</span>
            </label>
            {doc.params.file.map(|f| view! { <p class="doc">{format!("Weights file: {f} (stored with the graph in the workspace; runs here and on the server use it)")}</p> })}
            <p class="hint">"Select a node to edit it. Press ? for the keyboard shortcuts."</p>
        </div>
    }
}
