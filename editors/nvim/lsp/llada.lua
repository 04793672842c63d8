--- Base config of the llada language server, found by vim.lsp.enable('llada') on 'runtimepath'.
--- require('llada').setup() layers the user's options (cmd, root markers, init_options) on top.

---@type vim.lsp.Config
return {
  cmd = { 'llada-lsp' },
  root_markers = { '.git' },
  -- Attaches to buffers that are files, never to unnamed scratch buffers; a file outside any project
  -- still gets completions (root nil).
  root_dir = function(bufnr, on_dir)
    if vim.api.nvim_buf_get_name(bufnr) ~= '' then
      on_dir(vim.fs.root(bufnr, vim.lsp.config.llada.root_markers or { '.git' }))
    end
  end,
  -- One model in memory serves every project: reuse the running server whatever the root.
  reuse_client = function(client, config)
    return client.name == config.name
  end,
  capabilities = {
    -- Opt in to `llada/draft` notifications: the live draft of an inline completion per denoising step.
    experimental = { lladaDrafts = true },
    -- Neovim applies versioned `documentChanges` (vim.lsp.util.apply_workspace_edit) but does not say
    -- so; saying it gets the rewrite's edit with its version, which the review checks.
    workspace = { workspaceEdit = { documentChanges = true } },
  },
}
