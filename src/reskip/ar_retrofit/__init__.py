"""AR-Retrofit: the side-channel on a frozen backbone (config, blocks, side_channel, depth_pass,
model, kv_cache, adapter_io, parity). Imports nothing from the later stages."""
