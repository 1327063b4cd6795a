//! YAML configuration files (`config_file` + `section_name`).
//!
//! The file is the base; values passed explicitly (constructor arguments, CLI flags) override
//! it leaf by leaf, keeping sibling keys of nested mappings.

use std::path::Path;

use serde_json::{Map, Value};

use crate::error::ConfigFileError;

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// The first non-finite number in `yaml` (`.inf`, `.nan`), by its dotted key: JSON has none,
/// and read into JSON it would silently become null, an unset field.
fn non_finite(yaml: &serde_yaml::Value, key: &str) -> Option<(String, f64)> {
    match yaml {
        serde_yaml::Value::Number(n) => n.as_f64().filter(|x| !x.is_finite()).map(|x| (key.to_string(), x)),
        serde_yaml::Value::Sequence(items) => {
            items.iter().enumerate().find_map(|(i, item)| non_finite(item, &format!("{key}[{i}]")))
        }
        serde_yaml::Value::Mapping(map) => map.iter().find_map(|(k, v)| {
            let name = k.as_str().map_or_else(|| format!("{k:?}"), str::to_string);
            non_finite(v, &if key.is_empty() { name } else { format!("{key}.{name}") })
        }),
        serde_yaml::Value::Tagged(tagged) => non_finite(&tagged.value, key),
        _ => None,
    }
}

/// Reads `path` (YAML) and returns the mapping at its root, or at `section` when given, its
/// speculative fields coerced to their kinds ([`super::flags::coerce_loose_values`]).
pub fn load_config_file(path: &Path, section: Option<&str>) -> Result<Map<String, Value>, ConfigFileError> {
    let mut values = read_config_file(path, section)?;
    super::flags::coerce_loose_values(&mut values);
    Ok(values)
}

fn read_config_file(path: &Path, section: Option<&str>) -> Result<Map<String, Value>, ConfigFileError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            ConfigFileError::NotFound { path: shown.clone() }
        } else {
            ConfigFileError::Io { path: shown.clone(), source }
        }
    })?;
    let root: Value = if text.trim().is_empty() {
        Value::Object(Map::new())
    } else {
        let yaml: serde_yaml::Value = serde_yaml::from_str(&text)
            .map_err(|e| ConfigFileError::Yaml { path: shown.clone(), message: e.to_string() })?;
        if let Some((key, value)) = non_finite(&yaml, "") {
            return Err(ConfigFileError::NonFinite { path: shown, key, value });
        }
        serde_yaml::from_value(yaml)
            .map_err(|e| ConfigFileError::Yaml { path: shown.clone(), message: e.to_string() })?
    };
    let Value::Object(root) = root else {
        return Err(ConfigFileError::NotAMapping { path: shown, found: kind_of(&root) });
    };
    let Some(section) = section else {
        return Ok(root);
    };
    match root.get(section) {
        Some(Value::Object(m)) => Ok(m.clone()),
        Some(other) => Err(ConfigFileError::SectionNotAMapping {
            path: shown,
            section: section.to_string(),
            found: kind_of(other),
        }),
        None => {
            let available: Vec<&str> = root.iter().filter(|(_, v)| v.is_object()).map(|(k, _)| k.as_str()).collect();
            Err(ConfigFileError::MissingSection {
                path: shown,
                section: section.to_string(),
                available: if available.is_empty() { "(none)".to_string() } else { available.join(", ") },
            })
        }
    }
}

/// Recursively merges `overrides` into `base`: mappings merge key by key, anything else in
/// `overrides` replaces the base value.
pub fn deep_merge(base: &mut Map<String, Value>, overrides: &Map<String, Value>) {
    for (key, value) in overrides {
        match (base.get_mut(key), value) {
            (Some(Value::Object(b)), Value::Object(o)) => deep_merge(b, o),
            _ => {
                base.insert(key.clone(), value.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn write(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    }

    #[test]
    fn loads_root_and_named_section() {
        let f = write("speculative:\n  speculative_method: eagle\nruntime:\n  x: 1\nname: plain\n");
        let root = load_config_file(f.path(), None).unwrap();
        assert!(root.contains_key("runtime"));
        let s = load_config_file(f.path(), Some("speculative")).unwrap();
        assert_eq!(s.get("speculative_method"), Some(&json!("eagle")));
    }

    #[test]
    fn errors_name_the_problem() {
        let missing = load_config_file(Path::new("/nonexistent/spec.yaml"), None).unwrap_err();
        assert!(matches!(missing, ConfigFileError::NotFound { .. }));
        let f = write("- 1\n- 2\n");
        let e = load_config_file(f.path(), None).unwrap_err().to_string();
        assert!(e.contains("mapping at its root, found a list"), "{e}");
        let f = write("speculative:\n  a: 1\nruntime:\n  b: 2\nname: x\n");
        let e = load_config_file(f.path(), Some("spec")).unwrap_err().to_string();
        assert!(e.contains("sections present: speculative, runtime"), "{e}");
        let e = load_config_file(f.path(), Some("name")).unwrap_err().to_string();
        assert!(e.contains("must be a mapping, found a string"), "{e}");
        // YAML's infinities read into JSON would be null, an unset field.
        let f = write("speculative:\n  synthetic_acceptance_rate: .inf\n");
        let e = load_config_file(f.path(), Some("speculative")).unwrap_err().to_string();
        assert!(e.contains("'speculative.synthetic_acceptance_rate'") && e.contains("is inf"), "{e}");
    }

    #[test]
    fn deep_merge_overrides_leaves_and_keeps_siblings() {
        let mut base = json!({"a": {"x": 1, "y": 2}, "b": 1}).as_object().unwrap().clone();
        let over = json!({"a": {"y": 3}, "c": [1]}).as_object().unwrap().clone();
        deep_merge(&mut base, &over);
        assert_eq!(Value::Object(base), json!({"a": {"x": 1, "y": 3}, "b": 1, "c": [1]}));
    }
}
