//! Types and pure packet logic shared by the XDP program (`lb-ebpf`) and the agent.
//!
//! Everything here is `no_std`, `#[repr(C)]` with explicit padding, and has the same layout on
//! both sides of the map boundary. With the `user` feature the map types implement `aya::Pod`.
#![no_std]

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
