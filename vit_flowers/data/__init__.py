"""Images and datasets: reading image files safely (:mod:`.images`), batched augmentation (:mod:`.augment`),
class folders and their train/val splits (:mod:`.splits`), the config's data section (:mod:`.config`), in-memory
datasets built through a registry of sources (:mod:`.datasets`) and the images the package draws itself
(:mod:`.synthetic` flowers)."""
