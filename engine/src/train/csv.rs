//! A small CSV reader for datasets: an optional header row, one label column (by name,
//! index or last) read as i32, every other column read as f32 features. Untrusted input:
//! rows, columns and elements are counted against the [`Limits`] as they arrive (the
//! caller bounds the bytes), every value is checked, and every error names the line and,
//! when one field is at fault, its column (both counted from 1, as editors do).
//!
//! The rules (`docs/datasets.md`): lines end in `\n` or `\r\n`; blank lines are skipped;
//! fields are separated by commas and trimmed of spaces and tabs; there is no quoting
//! (a header name may be wrapped in one pair of double quotes); every row has as many
//! fields as the first; features are finite numbers, labels finite whole numbers that
//! fit in i32 (`3` or `3.0`), within `[0, classes)` when a class count is given.

use crate::graph::limits::{echo, Limit, Limits, Widen};
use crate::tensor::Tensor;

/// Which column of a CSV table holds the labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelColumn {
    /// The column with this name in the header row.
    Name(String),
    /// The column at this index, counting from 0.
    Index(usize),
    /// The last column.
    Last,
}

/// How to read a CSV table as a dataset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsvOptions {
    /// Whether the first non-blank line is a header row of column names.
    pub header: bool,
    /// The label column.
    pub label: LabelColumn,
    /// The number of classes: when given, every label must lie in `[0, classes)`.
    pub classes: Option<usize>,
}

impl Default for CsvOptions {
    /// A header row, labels in the last column, no class count.
    fn default() -> Self {
        CsvOptions {
            header: true,
            label: LabelColumn::Last,
            classes: None,
        }
    }
}

/// Why a CSV table could not be read: the line, the column when one field is at fault
/// (both from 1), and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}{}: {message}", column.map(|c| format!(", column {c}")).unwrap_or_default())]
pub struct CsvError {
    /// The line, from 1.
    pub line: usize,
    /// The column, from 1, when one field is at fault.
    pub column: Option<usize>,
    /// What is wrong.
    pub message: String,
}

fn at(line: usize, column: Option<usize>, message: impl Into<String>) -> CsvError {
    CsvError {
        line,
        column,
        message: message.into(),
    }
}

/// The columns of a table and where its labels are, fixed by its first non-blank line.
struct Layout {
    /// Fields per row.
    columns: usize,
    /// The label column, from 0.
    label: usize,
    /// The line that fixed the layout.
    line: usize,
}

impl Layout {
    /// The layout of a table whose first line (`text`, at `line`) has `columns` fields
    /// (a header row when the options say so).
    fn new(
        text: &str,
        line: usize,
        columns: usize,
        options: &CsvOptions,
    ) -> Result<Layout, CsvError> {
        let label = match &options.label {
            LabelColumn::Last => columns.saturating_sub(1),
            LabelColumn::Index(i) if *i < columns => *i,
            LabelColumn::Index(i) => {
                return Err(at(
                    line,
                    None,
                    format!(
                        "the label column index {i} (counting from 0) is past the last of \
                         the {columns} columns"
                    ),
                ))
            }
            LabelColumn::Name(name) if !options.header => {
                return Err(at(
                    line,
                    None,
                    format!(
                        "the label column is named '{}', but the table is read without a \
                         header row",
                        echo(name)
                    ),
                ))
            }
            LabelColumn::Name(name) => by_name(text, line, name)?,
        };
        if columns < 2 {
            return Err(at(
                line,
                None,
                "only one column: a dataset needs the label column and at least one feature column",
            ));
        }
        Ok(Layout {
            columns,
            label,
            line,
        })
    }
}

/// The index of the header column named `name` (exactly one must be).
fn by_name(text: &str, line: usize, name: &str) -> Result<usize, CsvError> {
    let mut found: Option<usize> = None;
    for (i, field) in text.split(',').enumerate() {
        if header_name(field) != name {
            continue;
        }
        if let Some(first) = found {
            return Err(at(
                line,
                Some(i + 1),
                format!(
                    "the label column '{}' is named twice (columns {} and {})",
                    echo(name),
                    first + 1,
                    i + 1
                ),
            ));
        }
        found = Some(i);
    }
    found.ok_or_else(|| {
        let names: Vec<String> = text
            .split(',')
            .take(10)
            .map(|f| echo(header_name(f)))
            .collect();
        let more = if text.split(',').nth(10).is_some() {
            ", …"
        } else {
            ""
        };
        at(
            line,
            None,
            format!(
                "no column is named '{}' (columns: {}{more})",
                echo(name),
                names.join(", ")
            ),
        )
    })
}

/// A header field as a name: trimmed, one pair of surrounding double quotes removed.
fn header_name(field: &str) -> &str {
    let f = trim(field);
    f.strip_prefix('"')
        .and_then(|f| f.strip_suffix('"'))
        .unwrap_or(f)
}

/// A field without its surrounding spaces and tabs.
fn trim(field: &str) -> &str {
    field.trim_matches([' ', '\t'])
}

/// A feature field as a finite f32.
fn feature(field: &str) -> Result<f32, String> {
    let f = trim(field);
    if f.is_empty() {
        return Err("empty field (features must be numbers)".into());
    }
    match f.parse::<f32>() {
        Ok(x) if x.is_finite() => Ok(x),
        Ok(_) => Err(format!("'{}' is not a finite number", echo(f))),
        Err(_) => Err(format!("'{}' is not a number", echo(f))),
    }
}

/// A label field as an i32 within `[0, classes)` when a class count is given.
fn label(field: &str, classes: Option<usize>) -> Result<i32, String> {
    let f = trim(field);
    if f.is_empty() {
        return Err("empty label (labels must be whole numbers)".into());
    }
    let x: f64 = f
        .parse()
        .map_err(|_| format!("label '{}' is not a number", echo(f)))?;
    if !x.is_finite() || x.fract() != 0.0 {
        return Err(format!("label '{}' is not a whole number", echo(f)));
    }
    if x < f64::from(i32::MIN) || x > f64::from(i32::MAX) {
        return Err(format!("label '{}' does not fit in i32", echo(f)));
    }
    // Whole and within i32's range: the conversion is exact.
    let y = x as i32;
    if let Some(k) = classes {
        if usize::try_from(y).map_or(true, |y| y >= k) {
            return Err(format!(
                "label {y} is outside the {k} classes (0 to {})",
                k.saturating_sub(1)
            ));
        }
    }
    Ok(y)
}

/// Parses a CSV table into features (f32 `[rows, columns - 1]`) and labels (i32
/// `[rows]`). The caller has bounded `bytes`; rows, columns and elements are checked
/// against `limits` before they are stored.
pub(super) fn parse(
    bytes: &[u8],
    options: &CsvOptions,
    limits: &Limits,
) -> Result<(Tensor, Tensor), CsvError> {
    if options.classes == Some(0) {
        return Err(at(1, None, "a class count of 0 leaves no valid label"));
    }
    let mut layout: Option<Layout> = None;
    let (mut features, mut labels): (Vec<f32>, Vec<i32>) = (Vec::new(), Vec::new());
    let mut last = 0;
    for (index, raw) in bytes.split(|&b| b == b'\n').enumerate() {
        let line = index.saturating_add(1);
        last = line;
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        if raw.iter().all(|b| matches!(b, b' ' | b'\t')) {
            continue;
        }
        let text = std::str::from_utf8(raw).map_err(|e| {
            let valid = raw.get(..e.valid_up_to()).unwrap_or_default();
            let column = valid.iter().filter(|&&b| b == b',').count() + 1;
            at(line, Some(column), "not UTF-8 text")
        })?;
        let fields = text.bytes().filter(|&b| b == b',').count() + 1;
        if layout.is_none() {
            limits
                .check(
                    Limit::MaxDatasetColumns,
                    "a CSV row",
                    "columns",
                    Some(fields.widen()),
                )
                .map_err(|e| {
                    at(
                        line,
                        Some(limits.max_dataset_columns.saturating_add(1)),
                        e.to_string(),
                    )
                })?;
            layout = Some(Layout::new(text, line, fields, options)?);
            if options.header {
                continue;
            }
        }
        let Some(layout) = &layout else {
            continue;
        };
        if fields != layout.columns {
            let column = fields.min(layout.columns) + 1;
            let what = if fields > layout.columns {
                "extra field"
            } else {
                "missing field"
            };
            return Err(at(
                line,
                Some(column),
                format!(
                    "{what}: the row has {fields} fields but line {} has {}",
                    layout.line, layout.columns
                ),
            ));
        }
        let rows = labels.len().saturating_add(1);
        limits
            .check(
                Limit::MaxDatasetRows,
                "the CSV dataset",
                "rows",
                Some(rows.widen()),
            )
            .map_err(|e| at(line, None, e.to_string()))?;
        let elements = rows.checked_mul(layout.columns - 1).map(Widen::widen);
        limits
            .check(
                Limit::MaxTensorElements,
                "the CSV dataset's features",
                "elements",
                elements,
            )
            .map_err(|e| at(line, None, e.to_string()))?;
        for (i, field) in text.split(',').enumerate() {
            let value = if i == layout.label {
                label(field, options.classes).map(|y| labels.push(y))
            } else {
                feature(field).map(|x| features.push(x))
            };
            value.map_err(|message| at(line, Some(i + 1), message))?;
        }
    }
    let Some(layout) = layout else {
        return Err(at(last.max(1), None, "the table is empty"));
    };
    if labels.is_empty() {
        return Err(at(last.max(1), None, "the table has no data rows"));
    }
    let rows = labels.len();
    Ok((
        Tensor::f32(vec![rows, layout.columns - 1], features),
        Tensor {
            shape: vec![rows],
            data: crate::tensor::TensorData::I32(labels),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str, options: &CsvOptions) -> Result<(Tensor, Tensor), CsvError> {
        parse(text.as_bytes(), options, &Limits::default())
    }

    fn error(text: &str, options: &CsvOptions) -> String {
        read(text, options).unwrap_err().to_string()
    }

    #[test]
    fn a_table_with_a_header_and_a_named_label_column() {
        let options = CsvOptions {
            label: LabelColumn::Name("class".into()),
            ..CsvOptions::default()
        };
        let text = "a, \"class\" ,b\r\n1.5,2,-3\n\n  0 ,0.0, 1e2 \n";
        let (x, y) = read(text, &options).unwrap();
        assert_eq!(x, Tensor::f32(vec![2, 2], vec![1.5, -3.0, 0.0, 100.0]));
        assert_eq!(y.shape, vec![2]);
        assert_eq!(y.data, crate::tensor::TensorData::I32(vec![2, 0]));
        // Without a header, by index and by default the last column.
        let options = CsvOptions {
            header: false,
            label: LabelColumn::Index(0),
            classes: Some(3),
        };
        let (x, y) = read("2,0.5\n1,0.25", &options).unwrap();
        assert_eq!(x.shape, vec![2, 1]);
        assert_eq!(y.data, crate::tensor::TensorData::I32(vec![2, 1]));
        let (x, _) = read("p,q,label\n1,2,3", &CsvOptions::default()).unwrap();
        assert_eq!(x.as_f32(), Some([1.0, 2.0].as_slice()));
    }

    #[test]
    fn every_error_names_its_line_and_column() {
        let d = CsvOptions::default();
        let no_header = CsvOptions {
            header: false,
            ..CsvOptions::default()
        };
        assert_eq!(
            error("a,b,y\n1,2,0\n3,4\n", &d),
            "line 3, column 3: missing field: the row has 2 fields but line 1 has 3"
        );
        assert_eq!(
            error("1,2,0\n\n3,4,5,6\n", &no_header),
            "line 3, column 4: extra field: the row has 4 fields but line 1 has 3"
        );
        assert_eq!(
            error("a,b,y\n1,x2,0\n", &d),
            "line 2, column 2: 'x2' is not a number"
        );
        assert_eq!(
            error("a,b,y\n1,,0\n", &d),
            "line 2, column 2: empty field (features must be numbers)"
        );
        assert_eq!(
            error("a,b,y\n1,inf,0\n", &d),
            "line 2, column 2: 'inf' is not a finite number"
        );
        assert_eq!(
            error("a,b,y\n1,2,0.5\n", &d),
            "line 2, column 3: label '0.5' is not a whole number"
        );
        assert_eq!(
            error("a,b,y\n1,2,3e10\n", &d),
            "line 2, column 3: label '3e10' does not fit in i32"
        );
        let classes = CsvOptions {
            classes: Some(3),
            ..CsvOptions::default()
        };
        assert_eq!(
            error("a,b,y\n1,2,0\n1,2,3\n", &classes),
            "line 3, column 3: label 3 is outside the 3 classes (0 to 2)"
        );
        assert_eq!(
            error("a,b,y\n1,2,-1\n", &classes),
            "line 2, column 3: label -1 is outside the 3 classes (0 to 2)"
        );
        let bytes = b"a,b,y\n1,\xff,0\n";
        assert_eq!(
            parse(bytes, &d, &Limits::default())
                .unwrap_err()
                .to_string(),
            "line 2, column 2: not UTF-8 text"
        );
    }

    #[test]
    fn label_columns_that_are_not_there_are_named() {
        let named = |name: &str| CsvOptions {
            label: LabelColumn::Name(name.into()),
            ..CsvOptions::default()
        };
        assert_eq!(
            error("\n a,b,c\n1,2,3\n", &named("target")),
            "line 2: no column is named 'target' (columns: a, b, c)"
        );
        assert_eq!(
            error("y,b,y\n1,2,3\n", &named("y")),
            "line 1, column 3: the label column 'y' is named twice (columns 1 and 3)"
        );
        let index = CsvOptions {
            label: LabelColumn::Index(3),
            ..CsvOptions::default()
        };
        assert_eq!(
            error("a,b,c\n1,2,3\n", &index),
            "line 1: the label column index 3 (counting from 0) is past the last of the 3 columns"
        );
        let no_header = CsvOptions {
            header: false,
            ..named("y")
        };
        assert!(error("1,2\n", &no_header).contains("without a header row"));
        assert_eq!(
            error("y\n1\n", &CsvOptions::default()),
            "line 1: only one column: a dataset needs the label column and at least one \
             feature column"
        );
        assert_eq!(
            error("\n\n", &CsvOptions::default()),
            "line 3: the table is empty"
        );
        assert_eq!(
            error("a,y\n", &CsvOptions::default()),
            "line 2: the table has no data rows"
        );
    }

    #[test]
    fn rows_columns_and_elements_are_limited_as_they_arrive() {
        let limits = Limits {
            max_dataset_rows: 2,
            ..Limits::default()
        };
        let e = parse(b"a,y\n1,0\n2,1\n3,0\n", &CsvOptions::default(), &limits)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "line 4: the CSV dataset needs 3 rows, over the limit of 2 rows \
             (max_dataset_rows; raise it with --max-dataset-rows)"
        );
        let limits = Limits {
            max_dataset_columns: 3,
            ..Limits::default()
        };
        let e = parse(b"a,b,c,y\n", &CsvOptions::default(), &limits)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("line 1, column 4: a CSV row needs 4 columns, over the limit of 3"),
            "{e}"
        );
        let limits = Limits {
            max_tensor_elements: 3,
            ..Limits::default()
        };
        let e = parse(b"a,b,y\n1,2,0\n3,4,1\n", &CsvOptions::default(), &limits)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("line 3: the CSV dataset's features needs 4 elements"),
            "{e}"
        );
    }

    #[test]
    fn arbitrary_bytes_give_an_answer_not_a_panic() {
        let mut rng = crate::rng::Rng::new(5);
        let alphabet = b"0123456789,.-e\n\r \"x";
        for _ in 0..2000 {
            let len = rng.below(40) as usize;
            let bytes: Vec<u8> = (0..len)
                .map(|_| alphabet[rng.below(alphabet.len() as u64) as usize])
                .collect();
            for header in [false, true] {
                let options = CsvOptions {
                    header,
                    label: LabelColumn::Index(1),
                    classes: Some(4),
                };
                if let Ok((x, y)) = parse(&bytes, &options, &Limits::default()) {
                    x.check().unwrap();
                    y.check().unwrap();
                    assert_eq!(x.shape[0], y.shape[0]);
                }
            }
        }
    }
}
