//! The embedded BPF object as built: properties of its code that cost time on every packet
//! and that no fixture's verdict would show.

use lb_agent::dataplane::EMBEDDED_OBJECT;
use object::{Object, ObjectSection, ObjectSymbol, RelocationTarget, SectionKind};

/// compiler-builtins' mem functions, which in BPF are byte loops.
const BYTE_LOOPS: [&str; 5] = ["memset", "memcpy", "memmove", "memcmp", "bcmp"];

/// A call of `memset` or `memcpy` is a zeroing or copy LLVM left as a byte loop, five
/// instructions a byte: zeroing the 64-byte FIB parameter block cost about 330. bpf-linker's
/// default (`memcpy` expanded "in order", for a JIT pattern matcher this kernel does not have)
/// left every `memset` LLVM could not fold as such a call; the build turns it off
/// (`xtask/src/ebpf.rs`). This holds the object to it.
#[test]
fn no_program_calls_a_byte_loop() {
    let file = object::File::parse(EMBEDDED_OBJECT).expect("the embedded object is ELF");
    let mut calls = Vec::new();
    for section in file.sections().filter(|s| s.kind() == SectionKind::Text) {
        for (offset, relocation) in section.relocations() {
            let RelocationTarget::Symbol(index) = relocation.target() else { continue };
            let name = file.symbol_by_index(index).and_then(|s| s.name()).unwrap_or_default();
            if BYTE_LOOPS.contains(&name) {
                calls.push(format!("{}+{offset:#x} calls {name}", section.name().unwrap_or("?")));
            }
        }
    }
    assert!(calls.is_empty(), "byte-loop calls in the object:\n{}", calls.join("\n"));
}
