//! `xds.type.v3.TypedStruct` (and its older twin `udpa.type.v1.TypedStruct`,
//! the same fields): an extension's config as a JSON-like `Struct` under a
//! type URL, the way xDS carries configs of extensions that have no proto
//! of their own, such as custom load-balancing policies (gRFC A52). Envoy's
//! API crate has neither package, so the message is declared here by its
//! proto tags, with conversions between `google.protobuf.Struct` and JSON.

use envoy_types::pb::google::protobuf::{value::Kind, ListValue, Struct, Value};

/// The `xds.type.v3` message.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypedStruct {
    /// The config's type: its last `/`-separated part names it (for an LB
    /// policy, the policy's name in the registry).
    #[prost(string, tag = "1")]
    pub type_url: String,
    /// The config.
    #[prost(message, optional, tag = "2")]
    pub value: Option<Struct>,
}

impl prost::Name for TypedStruct {
    const NAME: &'static str = "TypedStruct";
    const PACKAGE: &'static str = "xds.type.v3";

    fn type_url() -> String {
        format!("type.googleapis.com/{}", Self::full_name())
    }
}

/// The full name of the older `udpa.type.v1.TypedStruct`, which has the
/// same fields and is read the same way.
pub const UDPA_TYPED_STRUCT: &str = "udpa.type.v1.TypedStruct";

impl TypedStruct {
    /// A typed struct naming `name` (as `type.googleapis.com/<name>`) with
    /// `config` (a JSON object; anything else is taken as an empty one).
    pub fn new(name: &str, config: &serde_json::Value) -> Self {
        let value = match json_to_value(config).kind {
            Some(Kind::StructValue(s)) => s,
            _ => Struct::default(),
        };
        TypedStruct {
            type_url: format!("type.googleapis.com/{name}"),
            value: Some(value),
        }
    }

    /// The name its type URL gives: the part after the last `/`, or `None`
    /// when that is empty.
    pub fn name(&self) -> Option<&str> {
        let name = self.type_url.rsplit('/').next().unwrap_or("");
        (!name.is_empty()).then_some(name)
    }

    /// The config as a JSON object (an empty one when unset).
    pub fn config(&self) -> serde_json::Value {
        match &self.value {
            Some(s) => struct_to_json(s),
            None => serde_json::Value::Object(serde_json::Map::new()),
        }
    }
}

/// A `Struct` as a JSON object.
pub fn struct_to_json(s: &Struct) -> serde_json::Value {
    serde_json::Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value_to_json(v)))
            .collect(),
    )
}

fn value_to_json(v: &Value) -> serde_json::Value {
    use serde_json::Value as J;
    match &v.kind {
        None | Some(Kind::NullValue(_)) => J::Null,
        Some(Kind::NumberValue(n)) => serde_json::Number::from_f64(*n).map_or(J::Null, J::Number),
        Some(Kind::StringValue(s)) => J::String(s.clone()),
        Some(Kind::BoolValue(b)) => J::Bool(*b),
        Some(Kind::StructValue(s)) => struct_to_json(s),
        Some(Kind::ListValue(l)) => J::Array(l.values.iter().map(value_to_json).collect()),
    }
}

/// A JSON value as a protobuf `Value` (numbers become doubles, as
/// `Struct` holds them).
pub fn json_to_value(j: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    let kind = match j {
        J::Null => Kind::NullValue(0),
        J::Bool(b) => Kind::BoolValue(*b),
        J::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(f64::NAN)),
        J::String(s) => Kind::StringValue(s.clone()),
        J::Array(a) => Kind::ListValue(ListValue {
            values: a.iter().map(json_to_value).collect(),
        }),
        J::Object(o) => Kind::StructValue(Struct {
            fields: o
                .iter()
                .map(|(k, v)| (k.clone(), json_to_value(v)))
                .collect(),
        }),
    };
    Value { kind: Some(kind) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;

    #[test]
    fn json_round_trips_and_the_name_is_the_last_part() {
        let config = serde_json::json!({
            "threshold": 0.5, "names": ["a", "b"], "on": true, "nested": {"x": null}
        });
        let t = TypedStruct::new("example.fewest_failures", &config);
        assert_eq!(t.type_url, "type.googleapis.com/example.fewest_failures");
        assert_eq!(t.name(), Some("example.fewest_failures"));
        let decoded = TypedStruct::decode(t.encode_to_vec().as_slice()).unwrap();
        assert_eq!(decoded.config(), config);
        let bare = TypedStruct {
            type_url: "no-slash".into(),
            value: None,
        };
        assert_eq!(bare.name(), Some("no-slash"));
        assert_eq!(bare.config(), serde_json::json!({}));
        let empty = TypedStruct {
            type_url: "type.googleapis.com/".into(),
            value: None,
        };
        assert_eq!(empty.name(), None);
    }
}
