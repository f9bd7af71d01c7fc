//! Parsing with locations: [`Config::parse`] reads the YAML, validates it,
//! and finds the line and column of the field a validation error names by
//! walking the text again along the field's path.

use std::fmt;

use super::{Config, Location, ModelError, Overrides};

impl Config {
    /// Parses and validates a configuration file's text.
    pub fn parse(text: &str) -> Result<Config, ModelError> {
        Config::parse_with(text, &Overrides::default())
    }

    /// Parses a configuration file's text, applies `overrides` (settings
    /// given on the command line) and validates the result.
    pub fn parse_with(text: &str, overrides: &Overrides) -> Result<Config, ModelError> {
        let mut config: Config =
            serde_yaml_ng::from_str(text).map_err(|e| ModelError::Parse(e.to_string()))?;
        overrides.apply(&mut config);
        config.validate().map_err(|e| e.located_in(text))?;
        Ok(config)
    }
}

impl ModelError {
    /// The error with the line and column of its field in `text`, the
    /// file it was found in (a field left out has none).
    pub(crate) fn located_in(mut self, text: &str) -> Self {
        if let ModelError::Invalid {
            field, location, ..
        } = &mut self
        {
            *location = locate(text, field);
        }
        self
    }
}

/// Finds `field` (a path such as `services[2].aggregate[1]`, as the
/// validation errors name fields) in the YAML text: a second walk over the
/// text that stops with an error at that node, whose mark the parser
/// gives. `None` when the path is not in the text.
fn locate(text: &str, field: &str) -> Option<Location> {
    let path = field_path(field)?;
    let de = serde_yaml_ng::Deserializer::from_str(text);
    let e = serde::de::DeserializeSeed::deserialize(Walk(&path), de).err()?;
    if !e.to_string().contains(FOUND) {
        return None;
    }
    e.location().map(|l| Location {
        line: l.line(),
        column: l.column(),
    })
}

/// One step of a field path.
#[derive(Debug, PartialEq)]
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

fn field_path(field: &str) -> Option<Vec<Step<'_>>> {
    let mut out = Vec::new();
    for part in field.split('.') {
        let (key, mut rest) = part.split_once('[').map_or((part, ""), |(k, r)| (k, r));
        if !key.is_empty() {
            out.push(Step::Key(key));
        }
        while !rest.is_empty() {
            let (n, after) = rest.split_once(']')?;
            out.push(Step::Index(n.parse().ok()?));
            rest = after.strip_prefix('[').unwrap_or(after);
        }
    }
    Some(out)
}

/// Marks the error [`Walk`] raises at the node it looks for.
const FOUND: &str = "the field looked for";

/// Walks a YAML document along a path; fails at its end.
struct Walk<'p, 'a>(&'p [Step<'a>]);

impl<'de> serde::de::DeserializeSeed<'de> for Walk<'_, '_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        if self.0.is_empty() {
            // Every visit fails (`expecting` is FOUND), at this node's mark.
            d.deserialize_any(Found)
        } else {
            d.deserialize_any(self)
        }
    }
}

impl<'de> serde::de::Visitor<'de> for Walk<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML node")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<serde_yaml_ng::Value>()? {
            match self.0.first() {
                Some(Step::Key(k)) if key.as_str() == Some(k) => {
                    map.next_value_seed(Walk(&self.0[1..]))?
                }
                _ => map.next_value::<serde::de::IgnoredAny>().map(drop)?,
            }
        }
        Ok(())
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0;
        loop {
            let more = match self.0.first() {
                Some(Step::Index(n)) if *n == i => seq.next_element_seed(Walk(&self.0[1..]))?,
                _ => seq.next_element::<serde::de::IgnoredAny>()?.map(drop),
            };
            if more.is_none() {
                return Ok(());
            }
            i += 1;
        }
    }
    // A scalar where the path goes on: the path is not in this file.
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

/// Rejects whatever node it is given.
struct Found;

impl serde::de::Visitor<'_> for Found {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(FOUND)
    }
}

#[cfg(test)]
mod tests {
    use super::{field_path, locate, Step};
    use crate::model::Location;

    const YAML: &str = r#"services:
  - name: api
    endpoints:
      - address: 127.0.0.1:9001
      - address: 127.0.0.1:9002
        locality: us/east
  - name: all
    aggregate: [api, other]
"#;

    fn at(line: usize, column: usize) -> Option<Location> {
        Some(Location { line, column })
    }

    #[test]
    fn a_field_path_is_keys_and_indexes() {
        assert_eq!(
            field_path("services[2].aggregate[1]"),
            Some(vec![
                Step::Key("services"),
                Step::Index(2),
                Step::Key("aggregate"),
                Step::Index(1),
            ])
        );
        // Keys may hold '/', as locality weights do.
        let weights = field_path("services[0].localityWeights.us/a").unwrap();
        assert_eq!(
            weights[2..],
            [Step::Key("localityWeights"), Step::Key("us/a")]
        );
        assert_eq!(field_path("a[x]"), None);
        assert_eq!(field_path("a[1"), None);
    }

    #[test]
    fn a_nested_field_is_found_at_its_value() {
        assert_eq!(locate(YAML, "services[0].endpoints[1].locality"), at(6, 19));
        assert_eq!(locate(YAML, "services[0].endpoints[0].address"), at(4, 18));
        assert_eq!(locate(YAML, "services[1].name"), at(7, 11));
    }

    #[test]
    fn a_list_entry_is_found_where_it_starts() {
        // In a flow list, at the entry's own text.
        assert_eq!(locate(YAML, "services[1].aggregate[1]"), at(8, 22));
        // In a block list, at the entry's first key.
        assert_eq!(locate(YAML, "services[0].endpoints[1]"), at(5, 9));
        // A list-valued field, at its first entry.
        assert_eq!(locate(YAML, "services[0].endpoints"), at(4, 7));
    }

    #[test]
    fn a_path_not_in_the_text_has_no_location() {
        assert_eq!(locate(YAML, "services[2].name"), None);
        assert_eq!(locate(YAML, "services[0].tls.envoy"), None);
        // Past a scalar.
        assert_eq!(locate(YAML, "services[0].name.first"), None);
        assert_eq!(locate(YAML, "services[0"), None);
    }
}
