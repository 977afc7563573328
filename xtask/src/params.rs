//! `xtask wgsl`'s check of typed launch parameters: each `LaunchParams` struct of
//! backend-wgpu against the WGSL struct of the same name (names, order and types of the
//! fields, through naga) and against the shader's constructor, which must read field `i`
//! from scalar slot `i` with the accessor of its type (`s`, `si`, `sf`).

use backend_wgpu::wgsl::{ParamsLayout, Variant};

/// Checks `layout` against the first default module that declares its struct.
#[cfg(test)]
pub fn check(layout: &ParamsLayout) -> Result<(), String> {
    check_in(layout, &backend_wgpu::wgsl::default_modules())
}

/// Checks `layout` against `modules` (`wgsl::default_modules()`, composed once by the
/// caller): the first that declares its struct.
pub fn check_in(layout: &ParamsLayout, modules: &[Variant]) -> Result<(), String> {
    let name = layout.name;
    let source = modules
        .iter()
        .map(|v| &v.module.source)
        .find(|src| src.contains(&format!("struct {name} {{")))
        .ok_or_else(|| format!("{name}: no shader declares `struct {name}`"))?;
    let module = naga::front::wgsl::parse_str(source).map_err(|e| format!("{name}: {e}"))?;
    let members = module
        .types
        .iter()
        .find_map(|(_, ty)| match &ty.inner {
            naga::TypeInner::Struct { members, .. } if ty.name.as_deref() == Some(name) => {
                Some(members)
            }
            _ => None,
        })
        .ok_or_else(|| format!("{name}: naga found no struct `{name}`"))?;
    let wgsl_fields: Vec<(String, &str)> = members
        .iter()
        .map(|m| {
            let ty = match module.types[m.ty].inner {
                naga::TypeInner::Scalar(naga::Scalar { kind, width: 4 }) => match kind {
                    naga::ScalarKind::Uint => "u32",
                    naga::ScalarKind::Sint => "i32",
                    naga::ScalarKind::Float => "f32",
                    _ => "other",
                },
                _ => "other",
            };
            (m.name.clone().unwrap_or_default(), ty)
        })
        .collect();
    let rust: Vec<(String, &str)> = layout
        .fields
        .iter()
        .map(|&(n, t)| (n.to_string(), t))
        .collect();
    if wgsl_fields != rust {
        return Err(format!(
            "{name}: the WGSL struct's fields {wgsl_fields:?} differ from the Rust struct's {rust:?}"
        ));
    }
    // The constructor: `return Name(s(0u), si(1u), ...);`, each field from its own slot.
    let call = format!("return {name}(");
    let start = source
        .find(&call)
        .ok_or_else(|| format!("{name}: no constructor `{call}...)`"))?
        + call.len();
    let end = start
        + source[start..]
            .find(");")
            .ok_or_else(|| format!("{name}: unterminated constructor"))?;
    let args: Vec<String> = source[start..end]
        .split(',')
        .map(|a| a.split_whitespace().collect())
        .collect();
    for (i, (field, ty)) in layout.fields.iter().enumerate() {
        let accessor = match *ty {
            "u32" => "s",
            "i32" => "si",
            _ => "sf",
        };
        let want = format!("{accessor}({i}u)");
        if args.get(i) != Some(&want) {
            return Err(format!(
                "{name}: field {i} ({field}: {ty}) must be read as `{want}`, the constructor has {:?}",
                args.get(i)
            ));
        }
    }
    if args.len() != layout.fields.len() {
        return Err(format!(
            "{name}: the constructor passes {} values for {} fields",
            args.len(),
            layout.fields.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use backend_wgpu::wgsl;

    /// The shipped structs agree; a Rust struct that drifted from its shader (a field
    /// renamed, retyped, dropped, or one the shader does not declare) is caught.
    #[test]
    fn layouts_agree_and_drift_is_caught() {
        for layout in wgsl::LAUNCH_PARAMS {
            check(layout).unwrap();
        }
        let real = wgsl::LAUNCH_PARAMS[0];
        let mut renamed = real.fields.to_vec();
        renamed[2].0 = "k_first";
        let mut retyped = real.fields.to_vec();
        retyped[4].1 = "u32";
        let dropped = &real.fields[..real.fields.len() - 1];
        for fields in [&renamed[..], &retyped[..], dropped] {
            let drifted = ParamsLayout {
                name: real.name,
                fields: Box::leak(fields.to_vec().into_boxed_slice()),
            };
            assert!(check(&drifted).is_err(), "{fields:?}");
        }
        let unknown = ParamsLayout {
            name: "NoSuchParams",
            fields: real.fields,
        };
        assert!(check(&unknown).is_err());
    }
}
