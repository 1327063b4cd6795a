//! Safetensors checkpoints: one file, or shards listed by `model.safetensors.index.json`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};

use crate::error::{ModelError, Result};

pub struct SafetensorsSource {
    files: MmapedSafetensors,
    names: BTreeSet<String>,
    description: String,
}

/// The safetensors files of a checkpoint directory or a single file.
pub fn checkpoint_files(path: &Path) -> Result<Vec<PathBuf>> {
    if path.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let index = path.join("model.safetensors.index.json");
    if index.is_file() {
        let text = std::fs::read_to_string(&index).map_err(|e| ModelError::file(&index, e.to_string()))?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| ModelError::file(&index, format!("invalid JSON: {e}")))?;
        let map = json
            .get("weight_map")
            .and_then(serde_json::Value::as_object)
            .ok_or_else(|| ModelError::file(&index, "has no 'weight_map' object"))?;
        let shards: BTreeSet<&str> = map.values().filter_map(serde_json::Value::as_str).collect();
        let files: Vec<PathBuf> = shards.into_iter().map(|s| path.join(s)).collect();
        for f in &files {
            if !f.is_file() {
                return Err(ModelError::file(f, "shard listed in model.safetensors.index.json is missing"));
            }
        }
        return Ok(files);
    }
    let single = path.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|e| ModelError::file(path, e.to_string()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    found.sort();
    if found.is_empty() {
        return Err(ModelError::file(
            path,
            "no model.safetensors, model.safetensors.index.json or *.safetensors file found",
        ));
    }
    Ok(found)
}

impl SafetensorsSource {
    pub fn open(files: &[PathBuf], description: String) -> Result<Self> {
        for f in files {
            check_header(f)?;
        }
        // SAFETY: the files are opened read-only; like every mmap-based loader we rely on them
        // not being truncated while the process runs.
        let files_mm = unsafe { MmapedSafetensors::multi(files) }.map_err(|e| {
            ModelError::file(files.first().map(PathBuf::as_path).unwrap_or(Path::new("?")), e.to_string())
        })?;
        let names = files_mm.tensors().into_iter().map(|(n, _)| n).collect();
        Ok(Self { files: files_mm, names, description })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.names.contains(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(String::as_str)
    }

    pub fn description(&self) -> &str {
        &self.description
    }

    pub fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.files.get(name).ok().map(|v| v.shape().to_vec())
    }

    /// Loads a tensor as stored (dtype of the file).
    pub fn load_raw(&self, name: &str, device: &Device) -> Result<Tensor> {
        if !self.contains(name) {
            return Err(ModelError::MissingTensor { name: name.to_string(), source_desc: self.description.clone() });
        }
        Ok(self.files.load(name, device)?)
    }

    /// Loads a float tensor converted to `dtype`.
    pub fn load(&self, name: &str, dtype: DType, device: &Device) -> Result<Tensor> {
        Ok(self.load_raw(name, device)?.to_dtype(dtype)?)
    }
}

/// Validates the safetensors header and that the data section is as long as it claims, so a
/// truncated download is reported with its path instead of failing later inside a forward.
fn check_header(path: &Path) -> Result<()> {
    use std::io::Read;
    let mut file = std::fs::File::open(path).map_err(|e| ModelError::file(path, e.to_string()))?;
    let file_len = file.metadata().map_err(|e| ModelError::file(path, e.to_string()))?.len();
    let mut len_bytes = [0u8; 8];
    file.read_exact(&mut len_bytes)
        .map_err(|_| ModelError::file(path, "truncated safetensors file: shorter than its 8-byte header length"))?;
    let header_len = u64::from_le_bytes(len_bytes);
    if header_len > file_len.saturating_sub(8) || header_len > 100_000_000 {
        return Err(ModelError::file(
            path,
            format!("truncated or corrupt safetensors file: header claims {header_len} bytes, file has {file_len}"),
        ));
    }
    let mut header = vec![0u8; header_len as usize];
    file.read_exact(&mut header).map_err(|e| ModelError::file(path, format!("truncated safetensors header: {e}")))?;
    let json: serde_json::Value = serde_json::from_slice(&header)
        .map_err(|e| ModelError::file(path, format!("corrupt safetensors header: {e}")))?;
    let data_len = file_len - 8 - header_len;
    let mut needed = 0u64;
    if let Some(map) = json.as_object() {
        for (name, info) in map {
            if name == "__metadata__" {
                continue;
            }
            if let Some(end) = info
                .get("data_offsets")
                .and_then(|o| o.as_array())
                .and_then(|o| o.get(1))
                .and_then(serde_json::Value::as_u64)
            {
                needed = needed.max(end);
            }
        }
    }
    if needed > data_len {
        return Err(ModelError::file(
            path,
            format!(
                "truncated safetensors file: tensors need {needed} data bytes, the file holds {data_len}; download it again"
            ),
        ));
    }
    Ok(())
}
