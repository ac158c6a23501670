//! Types and pure packet logic shared by the XDP program (`lb-ebpf`) and the agent.
//!
//! Everything here is `no_std`, `#[repr(C)]` with explicit padding, and has the same layout on
//! both sides of the map boundary. With the `user` feature the map types implement `aya::Pod`.
#![no_std]
// Inline assembly in the XDP program's build, for word loads of addresses (`words`).
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]

pub mod arp;
pub mod counters;
pub mod csum;
pub mod endpoint_services;
pub mod flow_table;
pub mod hash;
pub mod maps;
mod murmur3;
pub mod ndp;
pub mod service;
pub mod vip_filter;
pub mod words;
