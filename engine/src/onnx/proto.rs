//! The part of ONNX's `onnx.proto3` (ONNX 1.17, IR version 10) that Sluice reads and
//! writes, as `prost` messages. Field numbers are the protocol's; fields Sluice never
//! reads (training info, functions, sparse initialisers, sequence and map types) are left
//! out, and prost skips them when decoding. Written by hand rather than generated: it is
//! this one small subset, and the engine then needs no code generator or `protoc` at
//! build time, on every target including wasm.

/// A whole model: the graph and the operator sets it binds to.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelProto {
    /// The IR version the model targets.
    #[prost(int64, tag = "1")]
    pub ir_version: i64,
    /// The operator sets the model uses (domain "" or "ai.onnx" is the standard one).
    #[prost(message, repeated, tag = "8")]
    pub opset_import: Vec<OperatorSetIdProto>,
    /// The tool that wrote the model.
    #[prost(string, tag = "2")]
    pub producer_name: String,
    /// Its version.
    #[prost(string, tag = "3")]
    pub producer_version: String,
    /// Human-readable documentation.
    #[prost(string, tag = "6")]
    pub doc_string: String,
    /// The graph.
    #[prost(message, optional, tag = "7")]
    pub graph: Option<GraphProto>,
}

/// An operator set and its version.
#[derive(Clone, PartialEq, prost::Message)]
pub struct OperatorSetIdProto {
    /// The domain ("" for the standard operators).
    #[prost(string, tag = "1")]
    pub domain: String,
    /// The opset version.
    #[prost(int64, tag = "2")]
    pub version: i64,
}

/// A graph: nodes in topological order, initialisers, inputs and outputs.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GraphProto {
    /// The nodes, sorted topologically.
    #[prost(message, repeated, tag = "1")]
    pub node: Vec<NodeProto>,
    /// Its name.
    #[prost(string, tag = "2")]
    pub name: String,
    /// Named constant tensors (the weights).
    #[prost(message, repeated, tag = "5")]
    pub initializer: Vec<TensorProto>,
    /// Documentation.
    #[prost(string, tag = "10")]
    pub doc_string: String,
    /// Inputs (older models list initialisers here too).
    #[prost(message, repeated, tag = "11")]
    pub input: Vec<ValueInfoProto>,
    /// Outputs.
    #[prost(message, repeated, tag = "12")]
    pub output: Vec<ValueInfoProto>,
    /// Types of intermediate values, where the writer gave them.
    #[prost(message, repeated, tag = "13")]
    pub value_info: Vec<ValueInfoProto>,
}

/// One operator application.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeProto {
    /// Input value names ("" for an omitted optional input).
    #[prost(string, repeated, tag = "1")]
    pub input: Vec<String>,
    /// Output value names.
    #[prost(string, repeated, tag = "2")]
    pub output: Vec<String>,
    /// The node's name (optional).
    #[prost(string, tag = "3")]
    pub name: String,
    /// The operator.
    #[prost(string, tag = "4")]
    pub op_type: String,
    /// The operator's domain ("" for the standard set).
    #[prost(string, tag = "7")]
    pub domain: String,
    /// Attributes.
    #[prost(message, repeated, tag = "5")]
    pub attribute: Vec<AttributeProto>,
    /// Documentation.
    #[prost(string, tag = "6")]
    pub doc_string: String,
}

/// An attribute: a name and one typed value.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AttributeProto {
    /// Its name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// A reference to a function's attribute (only inside functions; refused).
    #[prost(string, tag = "21")]
    pub ref_attr_name: String,
    /// Which field holds the value ([`attribute_type`]).
    #[prost(int32, tag = "20")]
    pub r#type: i32,
    /// FLOAT.
    #[prost(float, tag = "2")]
    pub f: f32,
    /// INT.
    #[prost(int64, tag = "3")]
    pub i: i64,
    /// STRING.
    #[prost(bytes = "vec", tag = "4")]
    pub s: Vec<u8>,
    /// TENSOR.
    #[prost(message, optional, tag = "5")]
    pub t: Option<TensorProto>,
    /// GRAPH (control flow; refused).
    #[prost(message, optional, boxed, tag = "6")]
    pub g: Option<Box<GraphProto>>,
    /// FLOATS.
    #[prost(float, repeated, tag = "7")]
    pub floats: Vec<f32>,
    /// INTS.
    #[prost(int64, repeated, tag = "8")]
    pub ints: Vec<i64>,
    /// STRINGS.
    #[prost(bytes = "vec", repeated, tag = "9")]
    pub strings: Vec<Vec<u8>>,
}

/// `AttributeProto.type` values.
pub mod attribute_type {
    /// A float.
    pub const FLOAT: i32 = 1;
    /// An integer.
    pub const INT: i32 = 2;
    /// A string.
    pub const STRING: i32 = 3;
    /// A tensor.
    pub const TENSOR: i32 = 4;
    /// A graph.
    pub const GRAPH: i32 = 5;
    /// Floats.
    pub const FLOATS: i32 = 6;
    /// Integers.
    pub const INTS: i32 = 7;
    /// Strings.
    pub const STRINGS: i32 = 8;
}

/// A graph input's or output's name and type.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueInfoProto {
    /// The value's name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Its type.
    #[prost(message, optional, tag = "2")]
    pub r#type: Option<TypeProto>,
    /// Documentation.
    #[prost(string, tag = "3")]
    pub doc_string: String,
}

/// A value's type (Sluice reads tensor types only).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeProto {
    /// A tensor type.
    #[prost(message, optional, tag = "1")]
    pub tensor_type: Option<TypeTensor>,
}

/// A tensor type: element type and shape.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeTensor {
    /// A [`data_type`] value.
    #[prost(int32, tag = "1")]
    pub elem_type: i32,
    /// The shape (absent: unknown rank).
    #[prost(message, optional, tag = "2")]
    pub shape: Option<TensorShapeProto>,
}

/// A shape of known rank.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorShapeProto {
    /// One entry per axis.
    #[prost(message, repeated, tag = "1")]
    pub dim: Vec<Dimension>,
}

/// One axis: a size, a symbol, or neither (unknown).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Dimension {
    /// A known size.
    #[prost(int64, optional, tag = "1")]
    pub dim_value: Option<i64>,
    /// A symbol such as "batch".
    #[prost(string, optional, tag = "2")]
    pub dim_param: Option<String>,
}

/// A tensor's dims, element type and data (in one of the typed fields, `raw_data`, or
/// an external file).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorProto {
    /// The shape.
    #[prost(int64, repeated, tag = "1")]
    pub dims: Vec<i64>,
    /// A [`data_type`] value.
    #[prost(int32, tag = "2")]
    pub data_type: i32,
    /// FLOAT elements.
    #[prost(float, repeated, tag = "4")]
    pub float_data: Vec<f32>,
    /// INT32, INT16, INT8, UINT16, UINT8, BOOL and FLOAT16 (as bits) elements.
    #[prost(int32, repeated, tag = "5")]
    pub int32_data: Vec<i32>,
    /// INT64 elements.
    #[prost(int64, repeated, tag = "7")]
    pub int64_data: Vec<i64>,
    /// The tensor's name.
    #[prost(string, tag = "8")]
    pub name: String,
    /// Little-endian fixed-width elements.
    #[prost(bytes = "vec", tag = "9")]
    pub raw_data: Vec<u8>,
    /// DOUBLE elements.
    #[prost(double, repeated, tag = "10")]
    pub double_data: Vec<f64>,
    /// UINT32 and UINT64 elements.
    #[prost(uint64, repeated, tag = "11")]
    pub uint64_data: Vec<u64>,
    /// Where external data lives: `location`, `offset`, `length`.
    #[prost(message, repeated, tag = "13")]
    pub external_data: Vec<StringStringEntryProto>,
    /// 1 when the data is in an external file.
    #[prost(int32, tag = "14")]
    pub data_location: i32,
}

/// A key and a value.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StringStringEntryProto {
    /// The key.
    #[prost(string, tag = "1")]
    pub key: String,
    /// The value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `TensorProto.data_type` / `TypeTensor.elem_type` values.
pub mod data_type {
    /// f32.
    pub const FLOAT: i32 = 1;
    /// u8.
    pub const UINT8: i32 = 2;
    /// i8.
    pub const INT8: i32 = 3;
    /// u16.
    pub const UINT16: i32 = 4;
    /// i16.
    pub const INT16: i32 = 5;
    /// i32.
    pub const INT32: i32 = 6;
    /// i64.
    pub const INT64: i32 = 7;
    /// bool.
    pub const BOOL: i32 = 9;
    /// f16.
    pub const FLOAT16: i32 = 10;
    /// f64.
    pub const DOUBLE: i32 = 11;
    /// u32.
    pub const UINT32: i32 = 12;
    /// u64.
    pub const UINT64: i32 = 13;
    /// bf16.
    pub const BFLOAT16: i32 = 16;

    /// The type's name in ONNX's spelling, for messages.
    pub fn name(t: i32) -> &'static str {
        match t {
            FLOAT => "float",
            UINT8 => "uint8",
            INT8 => "int8",
            UINT16 => "uint16",
            INT16 => "int16",
            INT32 => "int32",
            INT64 => "int64",
            8 => "string",
            BOOL => "bool",
            FLOAT16 => "float16",
            DOUBLE => "double",
            UINT32 => "uint32",
            UINT64 => "uint64",
            14 | 15 => "complex",
            BFLOAT16 => "bfloat16",
            _ => "an unknown type",
        }
    }
}
