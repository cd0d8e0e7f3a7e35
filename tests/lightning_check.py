"""Run on a CUDA machine with Lightning: the hook through ``DDPStrategy(ddp_comm_hook=...)``.

Lightning registers communication hooks only on CUDA devices; the state is built before
Lightning starts the process group (it looks the group up at the first backward pass).
"""

import torch

try:
    import lightning as L
    from lightning.pytorch.strategies import DDPStrategy
except ImportError:  # the older package name
    import pytorch_lightning as L
    from pytorch_lightning.strategies import DDPStrategy

from compressors.ddp import SparDLState, spardl_hook


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)
        )

    def training_step(self, batch, index):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


generator = torch.Generator().manual_seed(0)
x = torch.randn(512, 32, generator=generator)
data = torch.utils.data.TensorDataset(x, x[:, :1] * 2)
model = Regression()
state = SparDLState(density=0.05, method="spardl", model=model)
trainer = L.Trainer(
    accelerator="gpu",
    devices=1,
    strategy=DDPStrategy(ddp_comm_state=state, ddp_comm_hook=spardl_hook),
    max_steps=20,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
)
trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=32))
assert state.synchronizers, "the hook never ran"
print(f"lightning hook checks passed: {len(state.synchronizers)} bucket layout(s)")
