//! The pin directory: one per map layout, its maps' shapes checked against this build's, and
//! the program links pinned beside them (so an agent restarted or upgraded replaces its
//! programs in place).

use super::*;

/// The XDP link's pin; its name records the attach mode (bpffs holds only BPF objects).
pub(super) fn xdp_pin_name(interface: &str, mode: AttachedMode) -> String {
    format!("xdp-{interface}-{}", mode.as_str())
}

pub(super) fn tc_pin_name(interface: &str) -> String {
    format!("tc-egress-{interface}")
}

/// The interface a link pin is for, from its name (see [`xdp_pin_name`], [`tc_pin_name`]).
pub(super) fn pinned_link_interface(pin: &str) -> Option<&str> {
    if let Some(rest) = pin.strip_prefix("tc-egress-") {
        return Some(rest);
    }
    let rest = pin.strip_prefix("xdp-")?;
    [AttachedMode::Native, AttachedMode::Skb]
        .iter()
        .find_map(|mode| rest.strip_suffix(mode.as_str())?.strip_suffix('-'))
}

/// Removes the link pins in `pin_dir` whose interface `detach` picks: the last reference to
/// a link, so its program leaves the interface.
pub(super) fn remove_link_pins(pin_dir: &Path, mut detach: impl FnMut(&str) -> bool) -> Result<()> {
    let read_err = |e| Error::io(format!("reading {}", pin_dir.display()), e);
    for entry in std::fs::read_dir(pin_dir).map_err(read_err)? {
        let path = entry.map_err(read_err)?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else { continue };
        if pinned_link_interface(name).is_some_and(&mut detach) {
            std::fs::remove_file(&path)
                .map_err(|e| Error::io(format!("removing the pinned link {}", path.display()), e))?;
        }
    }
    Ok(())
}

/// Pins that an agent of another layout left under `pin_path` (`v<N>` beside this build's
/// directory): the links of `interfaces` move into `pin_dir`, so this build's programs replace
/// theirs in place (forwarding does not stop), and the directory goes, with its maps. A
/// directory still holding another interface's links is left alone, with a warning.
pub(super) fn take_over_earlier_layouts(pin_path: &Path, pin_dir: &Path, interfaces: &[&str]) -> Result<()> {
    let read_err = |e| Error::io(format!("reading {}", pin_path.display()), e);
    for entry in std::fs::read_dir(pin_path).map_err(read_err)? {
        let old = entry.map_err(read_err)?.path();
        let name = old.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let is_layout = name.strip_prefix('v').is_some_and(|v| v.parse::<u32>().is_ok());
        if !is_layout || old == pin_dir {
            continue;
        }
        let links: Vec<String> = interfaces
            .iter()
            .flat_map(|interface| {
                [
                    xdp_pin_name(interface, AttachedMode::Native),
                    xdp_pin_name(interface, AttachedMode::Skb),
                    tc_pin_name(interface),
                ]
            })
            .collect();
        for link in &links {
            let (from, to) = (old.join(link), pin_dir.join(link));
            if from.exists() && !to.exists() {
                std::fs::rename(&from, &to).map_err(|e| {
                    Error::io(format!("moving the pinned link {} to {}", from.display(), to.display()), e)
                })?;
            }
        }
        let others: Vec<String> = std::fs::read_dir(&old)
            .map_err(|e| Error::io(format!("reading {}", old.display()), e))?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| (n.starts_with("xdp-") || n.starts_with("tc-")) && !links.contains(n))
            .collect();
        if !others.is_empty() {
            warn!(
                pins = %old.display(),
                links = %others.join(", "),
                "pins of another map layout hold other interfaces' programs; leaving them"
            );
            continue;
        }
        warn!(
            pins = %old.display(),
            layout = LAYOUT_VERSION,
            "pins of another map layout: this build's programs replace theirs in place, on new maps \
             (established flows are re-balanced); removing them"
        );
        remove_pins(&old)?;
    }
    Ok(())
}

/// The shape of a map, as the kernel reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct MapShape {
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    flags: u32,
}

impl std::fmt::Display for MapShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "key {} B, value {} B, {} entries, flags {:#x}",
            self.key_size, self.value_size, self.max_entries, self.flags
        )
    }
}

/// Every pinned map's shape as this build creates it: the object's definitions, with the
/// sizes `dataplane.capacity` sets.
pub(super) fn expected_shapes(sizes: &[(&'static str, u32)]) -> Result<Vec<(&'static str, MapShape)>> {
    let object = aya_obj::Object::parse(EMBEDDED_OBJECT)
        .map_err(|e| Error::io("parsing the embedded BPF object", std::io::Error::other(e)))?;
    PINNED_MAPS
        .iter()
        .map(|&name| {
            let map = object.maps.get(name).ok_or(Error::BpfMapMissing(name))?;
            let max_entries =
                sizes.iter().find(|(n, _)| *n == name).map_or(map.max_entries(), |(_, size)| *size);
            let shape = MapShape {
                key_size: map.key_size(),
                value_size: map.value_size(),
                max_entries,
                flags: map.map_flags(),
            };
            Ok((name, shape))
        })
        .collect()
}

/// A pinned map keeps the shape it was created with. When one differs from this build's
/// (`dataplane.capacity` changed, or pins of an incompatible build), every map pin goes (the
/// maps reference each other's slots, so none is kept alone): the new maps start empty and are
/// filled by the first sync; the program links stay, so the new program replaces the old one
/// in place. Established flows are re-hashed.
pub(super) fn replace_incompatible_maps(pin_dir: &Path, sizes: &[(&'static str, u32)]) -> Result<()> {
    let mut differing = Vec::new();
    let mut standalone = Vec::new();
    for (name, wanted) in expected_shapes(sizes)? {
        let path = pin_dir.join(name);
        let Ok(info) = aya::maps::MapInfo::from_pin(&path) else { continue };
        let pinned = MapShape {
            key_size: info.key_size(),
            value_size: info.value_size(),
            max_entries: info.max_entries(),
            flags: info.map_flags(),
        };
        if pinned != wanted {
            let change = format!("{} ({pinned} → {wanted})", path.display());
            if STANDALONE_MAPS.contains(&name) {
                standalone.push((path, change))
            } else {
                differing.push(change)
            }
        }
    }
    for (path, change) in standalone {
        warn!(%change, "a pinned counter map differs from this build's: replacing it alone (its counts restart)");
        std::fs::remove_file(&path)
            .map_err(|e| Error::io(format!("removing the pinned map {}", path.display()), e))?;
    }
    if differing.is_empty() {
        return Ok(());
    }
    warn!(
        differing = %differing.join(", "),
        "pinned maps differ from this build's (dataplane.capacity changed, or an incompatible \
         build pinned them): replacing them (established flows are re-balanced)"
    );
    for name in PINNED_MAPS {
        let path = pin_dir.join(name);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(format!("removing the pinned map {}", path.display()), e)),
        }
    }
    Ok(())
}

/// Removes a pin directory: unpinning a link detaches its program, unpinning a map frees it
/// once no program uses it. `lb-agent cleanup` and `keepOnExit: false` both end here.
pub fn remove_pins(pin_dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(pin_dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("removing {}", pin_dir.display()), e)),
    }
}

pub(super) fn prepare_pin_dir(pin_dir: &Path) -> Result<()> {
    std::fs::create_dir_all(pin_dir).map_err(|e| Error::Pin {
        path: pin_dir.to_owned(),
        reason: format!("cannot create the directory ({e}); dataplane.pinPath must be on a mounted bpffs"),
    })?;
    let c_path = std::ffi::CString::new(pin_dir.as_os_str().as_encoded_bytes()).map_err(|_| Error::Pin {
        path: pin_dir.to_owned(),
        reason: "the path contains a NUL byte".into(),
    })?;
    // SAFETY: `statfs` writes into the zeroed struct we own; the path is NUL-terminated.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c_path.as_ptr(), &mut stat) } != 0 || stat.f_type as i64 != BPF_FS_MAGIC {
        return Err(Error::Pin {
            path: pin_dir.to_owned(),
            reason: "not on a bpffs (mount one with `mount -t bpf bpf /sys/fs/bpf`), so nothing could survive a restart"
                .into(),
        });
    }
    Ok(())
}
